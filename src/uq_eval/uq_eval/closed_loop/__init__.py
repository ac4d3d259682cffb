"""The grasp task in closed loop over DDS: the demo, the shared-autonomy and ask-for-help
evaluations and their scores."""
