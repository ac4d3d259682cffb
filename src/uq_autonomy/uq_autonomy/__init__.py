"""Shared autonomy from perception uncertainty.

The package splits by concern; each subpackage is ROS-free, and the ``*_node`` modules at the
top are thin ROS 2 adapters over them:

- :mod:`.arbitration`: the level of autonomy, its fail-safe and its parameters
  (``arbitration_node``);
- :mod:`.help`: when to ask a person about an object, and teaching the answer
  (``ask_for_help_node``);
- :mod:`.labels`: the durable label store (SQLite or PostgreSQL), its validation, COCO
  export and import, the ``uq labels`` commands and the labelling web page;
- :mod:`.reach_policy`: the grasp task's reach toward the target (``reach_policy_node``).

The arbitration's per-message path imports nothing from :mod:`.help` or :mod:`.labels`.
"""
