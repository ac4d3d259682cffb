"""Where the detector finds its shipped model files in every kind of install.

The top-level ``models/`` folder is installed by ``setup.py`` into the package's share
directory (``share/uq_perception/models``), which the ament index finds in a normal
``colcon build``, a ``--symlink-install`` build and a Docker image alike. ``UQ_MODEL_DIR``
overrides it, and a source checkout that was never built falls back to its ``models/``.
The node's ``model_path`` / ``gp_path`` parameters override single files.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from uq_common.file_kind import describe_file

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
    installed = _installed_model_dir()
    if installed is not None and (installed / DETECTOR_FILE).exists():
        return installed
    return source_checkout_model_dir()


def _installed_model_dir() -> Path | None:
    """The installed package's ``share/uq_perception/models``; None without the ament index
    (the ROS-free packages run from source on machines without ROS) or the package."""
    try:
        from ament_index_python.packages import (
            PackageNotFoundError,
            get_package_share_directory,
        )
    except ImportError:
        return None
    try:
        return Path(get_package_share_directory(PACKAGE)) / 'models'
    except (PackageNotFoundError, ValueError):
        return None


def source_checkout_model_dir() -> Path:
    """The workspace's ``models/``, for a package run from its source folder."""
    return Path(__file__).resolve().parents[4] / 'models'


def default_detector_path() -> Path:
    """The shipped detector weights."""
    return shipped_model_dir() / DETECTOR_FILE


def default_gp_path() -> Path:
    """The NTK-GP artefact fitted for the shipped detector."""
    return shipped_model_dir() / GP_FILE


def model_format_mismatch(path: str | Path, model_format: str) -> str:
    """Why the file at ``path`` cannot be a model of ``model_format``, judged from its bytes
    ('' when it may be, or when there is no such file: the readers say that).

    A detector saved by uq_perception (``torch``) is the zip archive ``torch.save`` writes;
    an ONNX file (``onnx``) is a protobuf message, which is never a zip archive.
    """
    path = Path(path)
    if not path.is_file():
        return ''
    archive = zipfile.is_zipfile(path)
    if model_format == 'onnx' and archive:
        return (f'model_format onnx reads ONNX files, but {path} is {describe_file(path)}: a '
                'detector saved by uq_perception needs model_format torch')
    if model_format == 'torch' and not archive:
        return (f'model_format torch reads detectors saved by uq_perception (torch.save zip '
                f'archives), but {path} is not one: an ONNX file needs model_format onnx')
    return ''
