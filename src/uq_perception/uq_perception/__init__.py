"""Uncertainty-gated perception: NTK-GP engine, detector, backends and the detector node."""
