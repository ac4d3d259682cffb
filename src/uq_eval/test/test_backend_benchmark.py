"""``uq bench backend``: argument rules, the summary against the baseline, and one short run
of the shipped model on this machine's backends."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from uq_eval.benchmarks.backend import (
    CPU_BASELINE,
    Variant,
    configure,
    frame_size,
    markdown_table,
    summarise,
)
from uq_perception.detectors.centernet import CenterNetDetector
from uq_perception.ntk import LastLayerNTKGP
from uq_perception.perception import UncertaintyPerception
from uq_perception.runtime.backends import TorchBackend


@pytest.mark.parametrize('text, expected', [('640x480', (640, 480)), ('1920X1080', (1920, 1080))])
def test_frame_sizes_are_width_by_height(text, expected):
    assert frame_size(text) == expected


@pytest.mark.parametrize('text', ['640', '640x', 'x480', '0x480', '640x-1', '9000x10', 'axb'])
def test_bad_frame_sizes_are_refused_by_rule(text):
    with pytest.raises(argparse.ArgumentTypeError):
        frame_size(text)


def _variant(label: str, baseline: str, times: list[float]) -> Variant:
    torch.manual_seed(0)
    model = CenterNetDetector(['a', 'b'], embedding_dim=4, input_size=(32, 32),
                              channels=(4, 4, 4, 4), neck_channels=4, max_candidates=4)
    rng = np.random.default_rng(0)
    gp = LastLayerNTKGP(rng.standard_normal((2, 4)), np.zeros(2)).fit(
        rng.standard_normal((50, 4)), rng.integers(0, 2, 50))
    backend = TorchBackend(model.eval())
    variant = Variant(label, baseline, backend, UncertaintyPerception(backend, gp))
    variant.times_ms = {'no_gp': list(times), 'with_gp': [2.0 * t for t in times]}
    return variant


def test_rows_give_percentiles_and_the_speedup_over_their_own_baseline():
    baseline = _variant(CPU_BASELINE, CPU_BASELINE, [10.0] * 99 + [20.0])
    faster = _variant('faster', CPU_BASELINE, [4.0] * 99 + [5.0])
    orphan = _variant('orphan', 'a baseline that did not run', [1.0])
    rows = summarise([baseline, faster, orphan], (640, 480))
    assert [row['frame'] for row in rows] == ['640x480'] * 3
    assert rows[0]['no_gp'] == {'p50_ms': 10.0, 'p99_ms': 10.1,
                                'speedup_over_baseline_p50': 1.0}
    assert rows[1]['no_gp']['speedup_over_baseline_p50'] == 2.5
    assert rows[1]['with_gp']['p50_ms'] == 8.0
    assert rows[1]['with_gp']['speedup_over_baseline_p50'] == 2.5
    assert rows[2]['no_gp']['speedup_over_baseline_p50'] is None
    table = markdown_table(rows)
    assert '| faster | 640x480 | 4.00 / 4.01 | 2.50 | 8.00 / 8.02 | 2.50 |' in table
    assert '| orphan | 640x480 | 1.00 / 1.00 | - |' in table


@pytest.mark.slow
def test_a_short_run_times_every_backend_of_this_machine(tmp_path, capsys):
    pytest.importorskip('mujoco', reason='the benchmark renders its frames with MuJoCo')
    parser = argparse.ArgumentParser()
    configure(parser)
    out = tmp_path / 'bench.json'
    args = parser.parse_args(['--runs', '3', '--warmup', '1', '--size', '320x240',
                              '--size', '640x480', '--json', str(out)])
    assert args.run(args) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert json.loads(printed.strip().splitlines()[-1]) == report
    variants = {row['variant'] for row in report['rows']}
    assert CPU_BASELINE in variants
    # ONNX Runtime runs here or says why not; CUDA rows appear exactly where CUDA exists.
    assert 'onnxruntime' in variants or 'onnxruntime' in report['skipped']
    assert any('cuda' in v for v in variants) == torch.cuda.is_available()
    assert len(report['rows']) == 2 * len(variants)
    for row in report['rows']:
        for column in ('no_gp', 'with_gp'):
            assert 0 < row[column]['p50_ms'] <= row[column]['p99_ms']
    assert report['environment']['torch'] == torch.__version__
    assert report['environment']['cuda'] == torch.version.cuda
    assert len(report['load_average_start']) == 3
    assert '| pytorch-cpu | 640x480 |' in printed
