"""How a detector runs on the robot (ROS-free): the backends of the shipped network, the
ONNX Runtime runner and the ONNX adapter of a user's detector, ONNX export, CUDA graphs,
TensorRT engine build, memory tuning, and model loading."""
