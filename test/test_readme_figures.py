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
SEED_STUDY = 'docs/benchmarks/mnist_seed_study.json'

def _worst(method: str) -> list[tuple[str, ...]]:
    return [('summary', method, name, 'worst') for name in ('FashionMNIST', 'KMNIST', 'notMNIST')]


# (text in the README with {} per figure, file, keys of each figure, format)
QUOTED = [
    ('forward p50 {} ms (1 thread)', EVAL, [('latency_ms', 'threads_1', 'forward_p50')], '.1f'),
    ('AP@0.5 {}', EVAL, [('detection_test', 'ap50_mean')], '.3f'),
    ('unknown-object recall {}', EVAL, [('uncertainty', 'unknown_recall')], '.3f'),
    ('GP-variance OOD AUROC {}', EVAL, [('uncertainty', 'auroc_unknown', 'gp_variance')],
     '.3f'),
    ('misclassification AUROC {}', EVAL,
     [('uncertainty', 'auroc_misclassification', 'predictive_entropy')], '.3f'),
    ('worst case over the {} runs', SEED_STUDY, [('summary', 'runs')], '.0f'),
    ('runs: OOD AUROC {} / {} / {} against', SEED_STUDY, _worst('ntk_gp_auroc'), '.3f'),
    ("deep ensemble's {} / {} / {}", SEED_STUDY, _worst('ensemble_auroc'), '.3f'),
]


@pytest.mark.parametrize('text,path,keys,fmt', QUOTED, ids=[q[0] for q in QUOTED])
def test_readme_figure_matches_committed_output(text, path, keys, fmt):
    expected = text.format(*(format(_field(path, *k), fmt) for k in keys))
    assert expected in README, f'README should say "{expected}" (from {path})'


def test_mnist_seed_study_rule_and_ece_match():
    study = json.loads((REPO / SEED_STUDY).read_text())
    rows = study['rows']
    assert len(rows) == study['summary']['runs'] == 10
    assert {(r['seed'], r['threads']) for r in rows} == {(s, t) for s in range(5) for t in (1, 2)}
    assert all(r['feature_map']['alpha'] == 2.0 and r['num_experts'] == 64 for r in rows)
    # The README says "ECE <= 0.004" and the cost range over the runs.
    assert max(r['ntk_gp_ece'] for r in rows) <= 0.004
    assert 'ECE <= 0.004' in README
    costs = [r['ntk_gp_cost_ratio'] for r in rows]
    assert f'cost {min(costs):.2f}-{max(costs):.2f}x a forward pass' in README
