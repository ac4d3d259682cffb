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
