"""The level of autonomy (ROS-free): levels, signals and thresholds (:mod:`.config`), the
checks of each frame and the driving detection (:mod:`.frame_validity`), the level state
machine and command blending (:mod:`.arbiter`), and the node's parameter table
(:mod:`.params`)."""
