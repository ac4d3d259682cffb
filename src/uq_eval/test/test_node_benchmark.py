"""``uq bench node`` with several backends side by side: the block schedule, the comparison,
and a tiny run of pytorch-cpu beside onnxruntime through the command line, each backend in
a detector node process of its own over real DDS. Speed itself is the benchmark's business
(docs/performance.md); here only its bookkeeping is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from uq_eval.benchmarks.node import (
    COMPARED,
    block_sizes,
    compare_backends,
    node_name,
    node_namespace,
    turn_order,
)
from uq_perception.detector_node import FRAME_STAGES
from uq_perception.runtime.backends import BackendKind

DOMAIN_ID = 100 + (zlib.crc32(b'test_node_benchmark') + os.getpid()) % 100


@pytest.mark.parametrize('count, rounds', [(300, 4), (7, 3), (3, 4), (1, 1)])
def test_blocks_share_the_frames_out(count, rounds):
    sizes = block_sizes(count, rounds)
    assert len(sizes) == rounds and sum(sizes) == count
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_backends_take_turns_in_alternating_order():
    backends = ['pytorch-cpu', 'onnxruntime', 'pytorch-cuda']
    orders = [turn_order(backends, r) for r in range(4)]
    assert orders[0] == orders[2] == backends
    assert orders[1] == orders[3] == backends[::-1]
    # Over two rounds each backend runs first and last once, or in the middle twice.
    positions = {b: sorted(order.index(b) for order in orders[:2]) for b in backends}
    assert positions == {'pytorch-cpu': [0, 2], 'onnxruntime': [1, 1], 'pytorch-cuda': [0, 2]}


def test_every_backend_has_its_own_node_and_topics():
    kinds = [k.value for k in BackendKind]
    assert len({node_name(k) for k in kinds}) == len({node_namespace(k) for k in kinds}) \
        == len(kinds)
    assert node_name('pytorch-cpu') == 'detector_node_pytorch_cpu'
    assert node_namespace('onnxruntime') == '/uq_bench_onnxruntime'


def _result(scale: float, lost: int = 0) -> dict:
    figures = {name: 10.0 * scale for name in COMPARED}
    return figures | {'frames_sent': 30, 'frames_answered': 30 - lost, 'frames_lost': lost,
                      'node_frames_dropped': 0, 'sustained': True, 'node_backend': 'x'}


def test_the_comparison_divides_by_the_first_backend():
    comparison = compare_backends({'pytorch-cpu': _result(1.0), 'onnxruntime': _result(0.4, 2)})
    assert comparison['reference_backend'] == 'pytorch-cpu'
    assert list(comparison['over_reference']) == ['onnxruntime']
    assert comparison['over_reference']['onnxruntime'] == pytest.approx(
        {'latency_p50': 0.4, 'latency_p99': 0.4, 'node_forward_p50': 0.4, 'forward_p50': 0.4})
    assert comparison['figures']['onnxruntime']['frames_lost'] == 2


def _bench(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, '-m', 'uq_common.cli', 'bench', 'node', '--domain-id', str(DOMAIN_ID),
         *arguments], capture_output=True, text=True, timeout=600,
        env=os.environ | {'ROS_DOMAIN_ID': str(DOMAIN_ID)})


def test_soak_runs_one_backend(capsys):
    # In this process, through the console script's main(): the refusal comes before any
    # node starts, and a process of its own only added the interpreter's start and the
    # commands' imports (seconds); the run below is the command as its own process.
    from uq_common.cli import main

    code = main(['bench', 'node', '--domain-id', str(DOMAIN_ID), '--duration', '5',
                 '--backend', 'pytorch-cpu', '--backend', 'onnxruntime'])
    assert code == 2
    assert capsys.readouterr().err == 'uq bench node: --duration (soak) runs one backend; ' \
        'give one --backend\n'


@pytest.mark.slow
def test_pytorch_cpu_beside_onnxruntime_in_one_run():
    pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')
    frames, rounds = 6, 2
    # A low rate: every period leaves room for the bare forward pass on a busy machine.
    out = _bench('--backend', 'pytorch-cpu', '--backend', 'onnxruntime', '--frames',
                 str(frames), '--rate', '3', '--rounds', str(rounds), '--width', '96',
                 '--height', '72')
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 3, out.stdout
    cpu, ort, comparison = lines
    for result, backend in ((cpu, 'pytorch-cpu'), (ort, 'onnxruntime')):
        assert result['backend'] == result['node_backend'] == backend
        assert result['frames_sent'] == frames and result['rounds'] == rounds
        # Best-effort images on a loaded machine may lose a few frames, never most.
        assert frames / 2 <= result['frames_answered'] <= frames
        assert result['frames_lost'] == frames - result['frames_answered']
        assert result['image_size'] == '96x72' and result['onnx_threads'] == 1
        assert result['latency_p99_ms'] >= result['latency_p50_ms'] > 0
        assert result['node_forward_p50_ms'] > 0
        # Every stage of a frame timed in the node, in order.
        assert list(result['node_stages']) == list(FRAME_STAGES)
        for name, stage in result['node_stages'].items():
            assert 0.0 <= stage['p50_ms'] <= stage['p99_ms'], (name, stage)
    assert ort['device'].startswith('onnxruntime cpu') and cpu['device'] == 'cpu'
    assert comparison['comparison'] is True and comparison['reference_backend'] == 'pytorch-cpu'
    assert comparison['rounds'] == rounds and comparison['image_size'] == '96x72'
    ratios = comparison['over_reference']['onnxruntime']
    for name in COMPARED:
        expected = ort[name] / cpu[name]
        assert ratios[name.removesuffix('_ms')] == pytest.approx(expected) or (
            np.isnan(expected) and np.isnan(ratios[name.removesuffix('_ms')]))
    assert set(comparison['figures']) == {'pytorch-cpu', 'onnxruntime'}
