"""The ``uq gp`` family: fitting and calibrating the NTK-GP of any contract detector."""
