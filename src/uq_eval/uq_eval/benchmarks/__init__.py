"""Runtime speed benchmarks: the NTK-GP engine, the detector node and the arbitration node."""
