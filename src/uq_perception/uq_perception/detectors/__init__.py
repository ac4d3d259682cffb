"""What a detector is (ROS-free): the detector contract, the shipped CenterNet, its packed
candidates, the ONNX graph's feature tap and its layer taps, the model files' formats, and
its detections as the standard 2D detection of vision_msgs."""
