"""The detector node's CUDA settings (cuda_graph, precision, gpu_preprocess): declared and
checked by the parameter specs, refused in one line for every backend but pytorch-cuda,
and handed to the backend factory as ``CudaOptions``. Checked here without a GPU; what the
options do on one is tested in test_cuda_graph.py, where CUDA exists."""

from __future__ import annotations

import itertools

import pytest
import torch
from rclpy.exceptions import InvalidParameterTypeException
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter

from uq_perception.detector_node import PARAMETERS, DetectorNode
from uq_perception.detectors.model_files import default_detector_path
from uq_perception.runtime.backends import BackendKind, BackendUnavailableError
from uq_perception.runtime.cuda_graph import CudaOptions, Precision
from uq_perception.runtime.loading import (
    RuntimeSettings,
    cuda_settings,
    load_model,
    runtime_from_parameters,
    start_detector,
)

DEFAULTS = {spec.name: spec.default for spec in PARAMETERS}
# Every combination that leaves eager FP32 (graph, precision, preprocessing).
NON_EAGER = [dict(zip(('cuda_graph', 'precision', 'gpu_preprocess'), values, strict=True))
             for values in itertools.product((False, True), ('fp32', 'fp16'), (False, True))
             if values != (False, 'fp32', False)]
OTHER_BACKENDS = [k.value for k in BackendKind if k is not BackendKind.PYTORCH_CUDA]


def test_the_node_declares_the_settings_with_eager_fp32_defaults():
    assert (DEFAULTS['cuda_graph'], DEFAULTS['precision'], DEFAULTS['gpu_preprocess']) == (
        False, 'fp32', False)
    assert runtime_from_parameters(DEFAULTS).cuda == CudaOptions()
    specs = {spec.name: spec for spec in PARAMETERS}
    assert list(specs['precision'].choices) == [p.value for p in Precision]
    assert all(specs[name].read_only for name in ('cuda_graph', 'precision', 'gpu_preprocess'))


@pytest.mark.parametrize('backend', OTHER_BACKENDS)
@pytest.mark.parametrize('settings', NON_EAGER, ids=lambda s: cuda_settings(CudaOptions(**s)))
def test_any_cuda_setting_is_refused_for_another_backend(backend, settings):
    values = DEFAULTS | {'backend': backend, 'engine_path': ''} | settings
    with pytest.raises(ValueError) as caught:
        runtime_from_parameters(values)
    message = str(caught.value)
    assert '\n' not in message
    assert message == (f'{cuda_settings(CudaOptions(**settings))}: for backend pytorch-cuda '
                       f'only, the backend is {backend}')
    # Each setting that was changed is named, and only those.
    for name, value in settings.items():
        assert (name in message) == (value != DEFAULTS[name])


@pytest.mark.parametrize('settings', NON_EAGER, ids=lambda s: cuda_settings(CudaOptions(**s)))
def test_pytorch_cuda_takes_every_combination(settings):
    runtime = runtime_from_parameters(DEFAULTS | {'backend': 'pytorch-cuda'} | settings)
    assert runtime.cuda == CudaOptions(**settings)
    assert not runtime.cuda.eager_fp32


def test_the_node_refuses_cuda_settings_of_another_backend_at_start(ros_context):
    with pytest.raises(ValueError, match='^cuda_graph true, precision fp16: for backend '
                                         'pytorch-cuda only, the backend is onnxruntime$'):
        DetectorNode(context=ros_context, parameter_overrides=[
            Parameter('cuda_graph', value=True), Parameter('precision', value='fp16')])


@pytest.mark.parametrize('value', ['int8', 'FP16', ''])
def test_an_unknown_precision_refuses_to_start(ros_context, value):
    with pytest.raises(ValueError, match="precision must be one of"):
        DetectorNode(context=ros_context, parameter_overrides=[
            Parameter('backend', value='pytorch-cuda'), Parameter('precision', value=value)])


@pytest.mark.parametrize('name, value', [('cuda_graph', 'yes'), ('gpu_preprocess', 1),
                                         ('precision', 16)])
def test_a_value_of_another_type_refuses_to_start(ros_context, name, value):
    with pytest.raises(InvalidParameterTypeException, match=name):
        DetectorNode(context=ros_context, parameter_overrides=[
            Parameter('backend', value='pytorch-cuda'), Parameter(name, value=value)])


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the refusal without CUDA')
def test_the_options_reach_the_cuda_graph_backend():
    # Only the graph backend names the options in its refusal: they reached the factory.
    loaded = load_model('torch', default_detector_path())
    runtime = RuntimeSettings(backend='pytorch-cuda',
                              cuda=CudaOptions(cuda_graph=True, precision='fp16'))
    with pytest.raises(BackendUnavailableError, match=r'pytorch-cuda \(graph fp16\) needs a '
                                                      'CUDA GPU'):
        start_detector(loaded, runtime)


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the refusal without CUDA')
def test_without_cuda_the_node_stays_unconfigured_saying_why(ros_context, capfd):
    node = DetectorNode(context=ros_context, parameter_overrides=[
        Parameter('backend', value='pytorch-cuda'), Parameter('cuda_graph', value=True),
        Parameter('gpu_preprocess', value=True), Parameter('persist_learnt_state', value=False)])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    finally:
        node.destroy_node()
    log = capfd.readouterr().err
    assert 'configure failed, staying unconfigured: BackendUnavailableError: backend ' \
        'pytorch-cuda (graph fp32 gpu-preprocess) needs a CUDA GPU' in log
