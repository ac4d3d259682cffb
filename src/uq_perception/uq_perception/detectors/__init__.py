"""What a detector is (ROS-free): the detector contract, the shipped CenterNet, its packed
candidates, the ONNX graph's feature tap and the model files' formats."""
