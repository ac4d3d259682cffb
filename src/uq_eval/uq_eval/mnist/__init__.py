"""The MNIST uncertainty benchmark on real data: the network, data readers, peer baselines,
pipeline and report."""
