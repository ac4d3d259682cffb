"""QoS profiles of topics that more than one package publishes or subscribes to."""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

# Help requests: reliable, and transient-local so that a late joiner (a labelling tool
# started after the robot) still gets the open requests.
HELP_REQUEST_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                              reliability=ReliabilityPolicy.RELIABLE,
                              durability=DurabilityPolicy.TRANSIENT_LOCAL)
