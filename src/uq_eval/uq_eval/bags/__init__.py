"""Recorded rosbag2 bags: recording simulated runs, replay through the running nodes, offline
evaluation and its report."""
