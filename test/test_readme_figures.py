"""The figures the README and the documents it links quote from committed output files still
match those files.

Each entry names a document, a phrase in it, the committed JSON file and the field each
figure comes from, and how the document rounds it; a retrained model or a rerun benchmark
that changes a figure fails here until the document is updated. The README carries one
headline figure per measurement; the model card and docs/benchmarks.md carry the rest, and
are checked the same way. Documents are compared with their runs of white space made one
space, so that a figure may sit across a line break.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

README = 'README.md'
MODEL_CARD = 'models/MODEL_CARD.md'
BENCHMARKS = 'docs/benchmarks.md'

EVAL = 'models/detector_eval.json'
SEED_STUDY = 'docs/benchmarks/mnist_seed_study.json'
SOAK = 'docs/benchmarks/node_soak_1200s.json'
ASK_FOR_HELP = 'docs/ask_for_help.md'
LABEL_LOAD = 'docs/benchmarks/label_store_load_60s.json'
BAG_EVALUATION = 'docs/bag_evaluation.md'
BAG_ARCHIVE = 'docs/benchmarks/bag_archive.json'
SHARED_AUTONOMY = 'docs/benchmarks/shared_autonomy_suites.json'


def _text(document: str) -> str:
    return ' '.join((REPO / document).read_text(encoding='utf-8').split())


def _field(path: str, *keys: str) -> float:
    value = json.loads((REPO / path).read_text())
    for key in keys:
        value = value[key]
    return float(value)


def _worst(method: str) -> list[tuple[str, ...]]:
    return [('summary', method, name, 'worst') for name in ('FashionMNIST', 'KMNIST', 'notMNIST')]


_LATENCY = ('latency_ms', 'threads_1')
_UNCERTAINTY = ('uncertainty',)

# (document, text with {} per figure, file, keys of each figure, format or one per figure)
QUOTED = [
    # README: one headline figure per row of "Measured figures".
    (README, 'GP-variance OOD AUROC {}', EVAL,
     [(*_UNCERTAINTY, 'auroc_unknown', 'gp_variance')], '.3f'),
    (README, 'misclassification AUROC {} (predictive entropy; GP variance {})', EVAL,
     [(*_UNCERTAINTY, 'auroc_misclassification', 'predictive_entropy'),
      (*_UNCERTAINTY, 'auroc_misclassification', 'gp_variance')], '.3f'),
    (README, 'worst case over the {} runs', SEED_STUDY, [('summary', 'runs')], '.0f'),
    (README, 'runs: OOD AUROC {} / {} / {} against', SEED_STUDY, _worst('ntk_gp_auroc'), '.3f'),
    (README, "deep ensemble's {} / {} / {}", SEED_STUDY, _worst('ensemble_auroc'), '.3f'),
    (README, '{} of {} frames answered', SOAK, [('frames_answered',), ('frames_sent',)], ',.0f'),
    # The model card: every figure of its table that detector_eval.json holds.
    (MODEL_CARD, '**{} / {} ms**; with the GP {} / {} ms', EVAL,
     [(*_LATENCY, 'forward_p50'), (*_LATENCY, 'forward_p99'),
      (*_LATENCY, 'detect_with_gp_p50'), (*_LATENCY, 'detect_with_gp_p99')], '.1f'),
    (MODEL_CARD, '| >= 0.90 | **{}** (', EVAL, [('detection_test', 'ap50_mean')], '.3f'),
    (MODEL_CARD, '| >= 0.80 | **{}** (', EVAL, [(*_UNCERTAINTY, 'unknown_recall')], '.3f'),
    (MODEL_CARD, '| >= 0.97 (missed) | **{}** (', EVAL,
     [(*_UNCERTAINTY, 'auroc_unknown', 'gp_variance')], '.3f'),
    (MODEL_CARD, 'predictive entropy {}, max softmax {})', EVAL,
     [(*_UNCERTAINTY, 'auroc_unknown', 'predictive_entropy'),
      (*_UNCERTAINTY, 'auroc_unknown', 'max_softmax')], '.3f'),
    (MODEL_CARD, '**{}** with predictive entropy (GP variance {})', EVAL,
     [(*_UNCERTAINTY, 'auroc_misclassification', 'predictive_entropy'),
      (*_UNCERTAINTY, 'auroc_misclassification', 'gp_variance')], '.3f'),
    (MODEL_CARD, 'matched known objects | | {} / {} |', EVAL,
     [(*_UNCERTAINTY, 'accuracy'), (*_UNCERTAINTY, 'ece')], '.3f'),
    (MODEL_CARD, 'known / unknown detections | | {} / {} |', EVAL,
     [(*_UNCERTAINTY, 'ood_flag_rate_known'), (*_UNCERTAINTY, 'ood_flag_rate_unknown')], '.3f'),
    # docs/ask_for_help.md: the label store under 10 robots for 60 s (`uq bench labels`).
    *[(ASK_FOR_HELP, f'| {name} | {{}} | {{}} / {{}} | {{}} / {{}} | {{}} | {{}} |', LABEL_LOAD,
       [(i, 'throughput_per_s'), (i, 'answer_ms_p50'), (i, 'answer_ms_p99'),
        (i, 'round_trip_ms_p50'), (i, 'round_trip_ms_p99'), (i, 'answers_acknowledged'),
        (i, 'labels_lost')], ('.1f',) * 5 + ('.0f', '.0f'))
      for i, name in enumerate(('SQLite', 'PostgreSQL'))],
    # docs/bag_evaluation.md: an archive of bags, serially and on Ray
    # (scripts/bench_bag_archive.py).
    *[(BAG_EVALUATION, f'| {mode} | {{}} | {{}} | {{}} | {{}}x | {{}}x |', BAG_ARCHIVE,
       [('modes', mode, key) for key in ('frames_per_s', 'evaluation_s', 'command_s',
                                         'command_over_serial', 'frames_per_s_over_serial')],
       ('.1f', '.1f', '.1f', '.2f', '.2f'))
      for mode in ('serial', 'ray 1 worker', 'ray 2 workers')],
    # docs/benchmarks.md: the seed study's worst cases.
    (BENCHMARKS, "GP variance reaches at worst {} / {} / {} (FashionMNIST / KMNIST / notMNIST), "
     'the ensemble at worst {} / {} / {}', SEED_STUDY,
     _worst('ntk_gp_auroc') + _worst('ensemble_auroc'), '.3f'),
    # README: the shared-autonomy benchmark's headline.
    (README, 'hard suite, wrong grasps: full autonomy {}/30, gated {}/30, gated with help {}/30',
     SHARED_AUTONOMY, [('suites', 'hard', 'policies', policy, 'wrong_grasps', 'count')
                       for policy in ('full_autonomy', 'gated', 'gated_help')], '.0f'),
]


@pytest.mark.parametrize('document,text,path,keys,fmt', QUOTED,
                         ids=[f'{q[0]}: {q[1]}' for q in QUOTED])
def test_quoted_figure_matches_committed_output(document, text, path, keys, fmt):
    # One format for every figure, or one per figure.
    formats = fmt if isinstance(fmt, tuple) else (fmt,) * len(keys)
    expected = text.format(*(format(_field(path, *k), f)
                             for k, f in zip(keys, formats, strict=True)))
    assert expected in _text(document), f'{document} should say "{expected}" (from {path})'


def test_mnist_seed_study_rule_ece_and_cost_match():
    study = json.loads((REPO / SEED_STUDY).read_text())
    rows = study['rows']
    assert len(rows) == study['summary']['runs'] == 10
    assert {(r['seed'], r['threads']) for r in rows} == {(s, t) for s in range(5) for t in (1, 2)}
    assert all(r['feature_map']['alpha'] == 2.0 and r['num_experts'] == 64 for r in rows)
    # docs/benchmarks.md gives the ECE range and the cost range over the runs.
    benchmarks = _text(BENCHMARKS)
    eces = [r['ntk_gp_ece'] for r in rows]
    assert max(eces) <= 0.01
    assert f'ECE** of the NTK-GP row {min(eces):.4f}-{max(eces):.4f}' in benchmarks
    costs = [r['ntk_gp_cost_ratio'] for r in rows]
    assert f'{min(costs):.2f}-{max(costs):.2f}x one forward pass (mean ' \
           f'{sum(costs) / len(costs):.2f}x)' in benchmarks


def test_soak_row_is_the_committed_run():
    soak = json.loads((REPO / SOAK).read_text())
    # The README's soak command names the backend, the size, the rate and the duration the
    # committed output was made with.
    assert soak['backend'] == 'pytorch-cpu' and soak['torch_threads'] == 1
    width, height = soak['image_size'].split('x')
    command = (f"uq bench node --backend {soak['backend']} --width {width} --height {height} "
               f"--rate {soak['rate_hz_requested']:g} --duration {soak['soak']['duration_s']:g}")
    assert command in _text(README), f'README should quote "{command}"'
