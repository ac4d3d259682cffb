"""Evaluation and benchmarks of the workspace: the demo, training command, detector, bag and
closed-loop evaluation, the MNIST uncertainty benchmark and the speed benchmarks."""
