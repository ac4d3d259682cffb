"""Simulated tabletop world (MuJoCo), synthetic datasets and the sim camera node."""
