"""The figures the README quotes from committed output files still match those files.

Each entry names a README phrase, the committed JSON file and the field it comes from, and
how the README rounds it; a retrained model or a rerun benchmark that changes a figure
fails here until the README is updated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / 'README.md').read_text()


def _field(path: str, *keys: str) -> float:
    value = json.loads((REPO / path).read_text())
    for key in keys:
        value = value[key]
    return float(value)


EVAL = 'models/detector_eval.json'
MNIST = 'docs/benchmarks/mnist_results.json'

def _ood(method: str) -> list[tuple[str, ...]]:
    return [('methods', method, 'ood', name, 'auroc')
            for name in ('FashionMNIST', 'KMNIST', 'notMNIST')]


# (text in the README with {} per figure, file, keys of each figure, format)
QUOTED = [
    ('forward p50 {} ms (1 thread)', EVAL, [('latency_ms', 'threads_1', 'forward_p50')], '.1f'),
    ('AP@0.5 {}', EVAL, [('detection_test', 'ap50_mean')], '.3f'),
    ('unknown-object recall {}', EVAL, [('uncertainty', 'unknown_recall')], '.3f'),
    ('GP-variance OOD AUROC {}', EVAL, [('uncertainty', 'auroc_unknown', 'gp_variance')],
     '.3f'),
    ('misclassification AUROC {}', EVAL,
     [('uncertainty', 'auroc_misclassification', 'predictive_entropy')], '.3f'),
    ('OOD AUROC {} / {} / {} against', MNIST, _ood('ntk_gp_norm'), '.3f'),
    ('OOD AUROC {} / {} / {} (M=16)', MNIST, _ood('ntk_gp_m'), '.2f'),
    ("deep ensemble's {} / {} / {}", MNIST, _ood('ensemble'), '.3f'),
    ('cost {}x a forward pass (target 1.1', MNIST, [('methods', 'ntk_gp_norm', 'cost_ratio')],
     '.3f'),
    ('laplace-torch 0.3 last-layer KFAC GLM probit {} / {} / {}', MNIST,
     _ood('laplace_last_layer'), '.3f'),
]


@pytest.mark.parametrize('text,path,keys,fmt', QUOTED, ids=[q[0] for q in QUOTED])
def test_readme_figure_matches_committed_output(text, path, keys, fmt):
    expected = text.format(*(format(_field(path, *k), fmt) for k in keys))
    assert expected in README, f'README should say "{expected}" (from {path})'


def test_mnist_experts_and_ece_match():
    methods = json.loads((REPO / MNIST).read_text())['methods']
    assert methods['ntk_gp_m']['hyperparameters']['num_experts'] == 16
    assert methods['ntk_gp_norm']['hyperparameters']['num_experts'] == 64
    assert methods['ntk_gp_norm']['feature_map']['alpha'] == 2.0
    # The README rounds the NTK-GP ECEs to "ECE 0.003".
    for name in ('ntk_gp_1', 'ntk_gp_m', 'ntk_gp_norm'):
        assert format(methods[name]['ece'], '.3f') == '0.003', name
    assert 'NTK-GP ECE 0.003' in README
