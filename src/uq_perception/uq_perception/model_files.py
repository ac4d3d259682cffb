"""Where the detector finds its shipped model files in every kind of install.

The top-level ``models/`` folder is installed by ``setup.py`` into the package's share
directory (``share/uq_perception/models``), which the ament index finds in a normal
``colcon build``, a ``--symlink-install`` build and a Docker image alike. ``UQ_MODEL_DIR``
overrides it, and a source checkout that was never built falls back to its ``models/``.
The node's ``model_path`` / ``gp_path`` parameters override single files.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = 'uq_perception'
DETECTOR_FILE = 'detector.pt'
GP_FILE = 'detector_gp.npz'
MODEL_DIR_VARIABLE = 'UQ_MODEL_DIR'


def shipped_model_dir() -> Path:
    """The folder of the shipped model: ``$UQ_MODEL_DIR``, else the installed package's
    ``share/uq_perception/models`` (ament index), else the source checkout's ``models/``."""
    override = os.environ.get(MODEL_DIR_VARIABLE)
    if override:
        return Path(override)
    try:
        from ament_index_python.packages import (
            PackageNotFoundError,
            get_package_share_directory,
        )

        installed = Path(get_package_share_directory(PACKAGE)) / 'models'
        if (installed / DETECTOR_FILE).exists():
            return installed
    except (ImportError, PackageNotFoundError, ValueError):
        pass
    return Path(__file__).resolve().parents[3] / 'models'


def default_detector_path() -> Path:
    """The shipped detector weights."""
    return shipped_model_dir() / DETECTOR_FILE


def default_gp_path() -> Path:
    """The NTK-GP artefact fitted for the shipped detector."""
    return shipped_model_dir() / GP_FILE
