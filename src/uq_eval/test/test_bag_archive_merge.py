"""The merged report of a bag archive (``uq_eval.bags.archive``), by rule, on hand-built
per-bag data: the bootstrap over bags (which bags a resample draws, what its intervals
may hold) and the order of the worst bags (lowest AP@0.5, ties broken by the highest ECE)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from uq_eval.bags import archive
from uq_eval.bags.archive import BOOTSTRAP_RESAMPLES, BagRow, bootstrap_intervals, merge_report
from uq_eval.bags.evaluation import EvaluationData
from uq_eval.bags.report import compute_metrics


def bag(correct: int, wrong: int, confidence: float = 0.9) -> EvaluationData:
    """One bag's data: ``correct + wrong`` known objects matched to ground truth, the first
    ``correct`` classified right (class 0 with ``confidence``), the rest wrong."""
    matched = [{'known': True, 'label': 0 if i < correct else 1, 'gp_variance': 0.1,
                'probabilities': [confidence, 1.0 - confidence]}
               for i in range(correct + wrong)]
    return EvaluationData(
        class_names=['mug', 'box'], matched=matched,
        ap_inputs={'mug': [(confidence, True)] * (correct + wrong)},
        ground_truth_counts={'mug': correct + wrong}, ground_truth_frames=correct + wrong)


def test_a_resample_draws_as_many_bags_as_there_are_and_every_bag_is_drawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Resampling whole bags with replacement: each resample is len(parts) draws from all of
    # them, the last included, each about equally often.
    for count in (2, 3, 5):
        parts = [bag(3 + i, 1) for i in range(count)]
        drawn: list[list[int]] = []
        real = archive.merge_data

        def recording(chosen, parts=parts, drawn=drawn, real=real):
            chosen = list(chosen)
            drawn.append([next(i for i, p in enumerate(parts) if p is c) for c in chosen])
            return real(chosen)

        monkeypatch.setattr(archive, 'merge_data', recording)
        bootstrap_intervals(parts)
        monkeypatch.setattr(archive, 'merge_data', real)
        assert len(drawn) == BOOTSTRAP_RESAMPLES
        assert all(len(pick) == count for pick in drawn)
        tally = Counter(itertools.chain.from_iterable(drawn))
        assert sorted(tally) == list(range(count)), tally  # 0 .. count - 1, none left out
        # Uniform: each bag's share of the draws within 5 standard deviations of 1/count.
        total, p = BOOTSTRAP_RESAMPLES * count, 1.0 / count
        sigma = math.sqrt(total * p * (1 - p))
        assert all(abs(n - total * p) < 5 * sigma for n in tally.values()), tally


def test_two_opposite_bags_give_an_interval_from_one_to_the_other_around_the_pooled_value():
    # One bag all right, one all wrong, the same size: a resample is both bags (accuracy
    # 0.5), one twice (1 or 0); a quarter each, so the 95 % interval is [0, 1] and holds the
    # pooled 0.5. A bootstrap that never draws one of them gives a single point.
    parts = [bag(8, 0), bag(0, 8)]
    pooled = compute_metrics(archive.merge_data(parts))['accuracy_matched']
    assert pooled == pytest.approx(0.5)
    for order in (parts, parts[::-1]):
        low, high = bootstrap_intervals(order)['accuracy_matched']
        assert (low, high) == (0.0, 1.0)
        assert low <= pooled <= high


def test_intervals_are_ordered_within_the_bags_range_and_repeatable():
    # The pooled accuracy of any resample lies between its bags' own accuracies, so the
    # interval lies within the range of the bags'; the same bags and seed, the same interval.
    rng = np.random.default_rng(5)
    for _ in range(6):
        count = int(rng.integers(2, 6))
        sizes = rng.integers(1, 12, (count, 2))
        parts = [bag(int(c), int(w)) for c, w in sizes]
        own = [compute_metrics(p)['accuracy_matched'] for p in parts]
        ci = bootstrap_intervals(parts)
        low, high = ci['accuracy_matched']
        assert min(own) - 1e-12 <= low <= high <= max(own) + 1e-12, (own, low, high)
        assert bootstrap_intervals(parts) == ci
    # Fewer than two bags: no interval (one bag cannot be resampled into anything else).
    assert set(bootstrap_intervals([bag(3, 1)]).values()) == {None}
    assert set(bootstrap_intervals([]).values()) == {None}


def _rows(cells: list[tuple[float | None, float | None]]) -> list[BagRow]:
    return [BagRow(f'bag_{i}', frames=10, frames_per_s=10.0 + i, map50=ap, ece=e)
            for i, (ap, e) in enumerate(cells)]


def _worst(rows: list[BagRow], top: int) -> list[str]:
    return merge_report(rows, [], 1.0, 'serial', 1, top=top)['worst']


def test_among_bags_tied_on_ap_the_worst_calibrated_comes_first():
    # Every AP tied: the order is by ECE alone, highest (worst calibrated) first, whatever
    # order the bags came in.
    eces = [0.02, 0.31, 0.10, 0.05, 0.27]
    rows = _rows([(0.6, e) for e in eces])
    expected = [f'bag_{i}' for i in sorted(range(len(eces)), key=lambda i: -eces[i])]
    for permutation in itertools.permutations(rows):
        assert _worst(list(permutation), top=len(rows)) == expected
        assert _worst(list(permutation), top=3) == expected[:3]


def test_worst_bags_are_ordered_by_ap_then_by_ece_descending():
    # The rule on random rows with many ties: each next bag has a higher AP, or the same AP
    # and no lower an ECE; the list is the first `top` of that order.
    rng = np.random.default_rng(11)
    for _ in range(100):
        count = int(rng.integers(2, 9))
        cells = [(float(rng.choice([0.2, 0.5, 0.8])), float(rng.choice([0.01, 0.1, 0.3])))
                 for _ in range(count)]
        rows = _rows(cells)
        rng.shuffle(rows)
        top = int(rng.integers(1, count + 1))
        worst = _worst(rows, top)
        by_name = {r.bag: r for r in rows}
        assert len(worst) == top
        for a, b in zip(worst, worst[1:], strict=False):
            ra, rb = by_name[a], by_name[b]
            assert ra.map50 < rb.map50 or (ra.map50 == rb.map50 and ra.ece >= rb.ece), worst
        # Nothing left out is worse than the last one listed.
        last = by_name[worst[-1]]
        for r in rows:
            if r.bag not in worst:
                assert (r.map50, -r.ece) >= (last.map50, -last.ece)


def test_failed_bags_are_never_among_the_worst():
    rows = _rows([(0.9, 0.01), (0.1, 0.2)])
    rows.append(BagRow('broken', error='cannot read bag: truncated'))
    assert _worst(rows, top=3) == ['bag_1', 'bag_0']
