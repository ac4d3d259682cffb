"""Off the robot (ROS-free): detector training, simulator and COCO data readers, GP fitting
and its score reference, detection scoring and uncertainty metrics. The per-frame path never
imports this package."""
