"""Uncertainty-gated perception for ROS 2.

The package reads from the robot outwards:

- the per-frame path at the top: :mod:`.detector_node` (the ROS node), :mod:`.perception`
  (one frame: detections, GP query, box sigma, duplicate suppression, tracking),
  :mod:`.box_uncertainty`, :mod:`.duplicate_suppression`, :mod:`.tracking`,
  :mod:`.messages`, :mod:`.overlay`, and :mod:`.teaching` (labels learnt online, called by
  the node);
- :mod:`.runtime`: how a detector runs on the robot (backends, ONNX Runtime, ONNX export,
  CUDA graphs, TensorRT engine build, memory tuning, model loading);
- :mod:`.detectors`: what a detector is (the contract, the shipped CenterNet, the ONNX
  graph's feature tap, model files, the standard 2D detection fields of vision_msgs);
- :mod:`.ntk`: the NTK-GP engine;
- :mod:`.training`: off the robot (training, data readers, GP fitting, score reference,
  detection scoring and metrics). Nothing on the per-frame path imports it.
"""
