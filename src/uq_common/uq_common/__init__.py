"""Infrastructure shared by every package of the workspace: the ``uq`` command host, the
parameter-spec framework, rolling statistics, image conversion and the node entry helper."""
