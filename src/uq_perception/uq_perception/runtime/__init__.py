"""How a detector runs on the robot (ROS-free): the backends of the shipped network, the
ONNX Runtime runner and the ONNX adapter of a user's detector (and its variant that also
reads the layers before the class layer), ONNX export, CUDA graphs, TensorRT engine build,
memory tuning, and model loading."""
