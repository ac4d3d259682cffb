"""A model file of the other format is named as such, from its bytes, before a reader fails
on it: the rule the launch file and the ONNX loading share (uq_perception.detectors.model_files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from uq_perception.detectors.model_files import default_detector_path, model_format_mismatch
from uq_perception.runtime.loading import load_model


@pytest.fixture(scope='module')
def onnx_file(tmp_path_factory) -> Path:
    onnx = pytest.importorskip('onnx', reason='onnx is part of the CPU install')
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node('Identity', ['x'], ['y'])], 'identity',
        [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 3])])
    path = tmp_path_factory.mktemp('onnx') / 'identity.onnx'
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_a_torch_archive_is_not_an_onnx_model():
    shipped = default_detector_path()
    message = model_format_mismatch(shipped, 'onnx')
    assert message.startswith(f'model_format onnx reads ONNX files, but {shipped} is a PyTorch '
                              'checkpoint (torch.save zip archive')
    assert message.endswith('a detector saved by uq_perception needs model_format torch')
    assert model_format_mismatch(shipped, 'torch') == ''


def test_an_onnx_file_is_not_a_torch_detector(onnx_file):
    assert model_format_mismatch(onnx_file, 'torch') == (
        'model_format torch reads detectors saved by uq_perception (torch.save zip archives), '
        f'but {onnx_file} is not one: an ONNX file needs model_format onnx')
    assert model_format_mismatch(onnx_file, 'onnx') == ''


def test_a_missing_file_is_left_to_the_readers(tmp_path):
    for model_format in ('torch', 'onnx'):
        assert model_format_mismatch(tmp_path / 'absent.onnx', model_format) == ''


def test_loading_a_torch_archive_as_onnx_says_which_format_it_is():
    with pytest.raises(ValueError, match='^model_format onnx reads ONNX files, but .* is a '
                                         r'PyTorch checkpoint .*needs model_format torch$'):
        load_model('onnx', default_detector_path())


def test_source_checkout_fallback_is_the_workspace_models_folder():
    """Run from source without the ament index (the ROS-free packages on a machine without
    ROS), the shipped model is read from the workspace's models/."""
    from uq_perception.detectors.model_files import DETECTOR_FILE, source_checkout_model_dir

    here = Path(__file__).resolve().parents[3] / 'models'
    assert source_checkout_model_dir() == here
    assert (source_checkout_model_dir() / DETECTOR_FILE).is_file()


def test_shipped_model_is_found_without_the_ament_index(monkeypatch):
    import builtins

    from uq_perception.detectors import model_files

    real_import = builtins.__import__

    def without_ament_index(name, *args, **kwargs):
        if name.startswith('ament_index_python'):
            raise ImportError(f'No module named {name!r}')
        return real_import(name, *args, **kwargs)

    monkeypatch.delenv(model_files.MODEL_DIR_VARIABLE, raising=False)
    monkeypatch.setattr(builtins, '__import__', without_ament_index)
    assert (model_files.shipped_model_dir() / model_files.DETECTOR_FILE).is_file()
