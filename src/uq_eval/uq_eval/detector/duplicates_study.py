"""What the duplicate suppression removes on simulator splits (``uq eval duplicates``).

The detector runs at the node's operating point (objectness 0.3, at most 20 detections)
over each split; every setting of the part rule's score ratio is then applied to the same
detections (``uq_perception.duplicate_suppression``), and the report counts, before and
after: the detections matched to no object at IoU 0.5 (false positives, duplicates among
them), and the objects found, split into objects that evaluation counts (known, unknown)
and those it ignores (occluded, truncated or tiny). An object is *lost* when some
detection found it before suppression and none does after.

The shipped ratio is the largest one of the grid that loses no counted object on the
validation split; ``test_unknown`` (known objects next to shapes never seen in training)
is the check that was not used for the choice.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uq_common.arguments import positive_int

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import Detections
    from uq_perception.duplicate_suppression import DuplicateSuppression
    from uq_perception.training.detector_data import DetectionSplit

DEFAULT_SPLITS = ('val', 'test_unknown')
DEFAULT_SCORE_RATIOS = (0.0, 0.4, 0.5, 0.6, 0.7, 0.8)


@dataclass(frozen=True)
class SuppressionCounts:
    """One split under one setting (see the module docstring)."""

    split: str
    score_ratio: float
    detections: int
    suppressed: int
    false_positives_before: int
    false_positives_after: int
    known_found: int
    known_lost: int
    unknown_found: int
    unknown_lost: int
    ignored_found: int
    ignored_lost: int


def count_split(name: str, split: DetectionSplit, detections: Sequence[Detections],
                suppression: DuplicateSuppression) -> SuppressionCounts:
    """Counts of one split's detections before and after ``suppression``."""
    from uq_perception.training.detection_metrics import match_detections
    from uq_perception.training.detection_scoring import IOU_THRESHOLD

    total = suppressed = fp_before = fp_after = 0
    found = {'known': 0, 'unknown': 0, 'ignored': 0}
    lost = dict.fromkeys(found, 0)
    for i, dets in enumerate(detections):
        if len(dets) == 0:
            continue
        hard = split.hard(i)
        keep = suppression.keep(dets.boxes, dets.scores)
        before, _ = match_detections(dets.boxes, dets.scores, split.boxes[i], IOU_THRESHOLD,
                                     hard)
        after, _ = match_detections(dets.boxes[keep], dets.scores[keep], split.boxes[i],
                                    IOU_THRESHOLD, hard)
        total += len(dets)
        suppressed += int((~keep).sum())
        fp_before += int((before < 0).sum())
        fp_after += int((after < 0).sum())
        still_found = set(after[after >= 0].tolist())
        for obj in set(before[before >= 0].tolist()):
            kind = 'ignored' if hard[obj] else (
                'known' if split.labels[i][obj] >= 0 else 'unknown')
            found[kind] += 1
            lost[kind] += obj not in still_found
    return SuppressionCounts(name, suppression.score_ratio, total, suppressed, fp_before,
                             fp_after, found['known'], lost['known'], found['unknown'],
                             lost['unknown'], found['ignored'], lost['ignored'])


def study(model_path: Path, data_dir: Path, splits: Sequence[str],
          score_ratios: Sequence[float], max_images: int | None = None
          ) -> list[SuppressionCounts]:
    """Run the detector once per split and count every score ratio's effect."""
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.duplicate_suppression import DuplicateSuppression
    from uq_perception.training.detection_scoring import (
        OPERATING_MAX_DETECTIONS,
        OPERATING_THRESHOLD,
        predict_split,
    )
    from uq_perception.training.detector_data import load_split

    model = load_detector(model_path)
    shipped = DuplicateSuppression()
    rows = []
    for name in splits:
        split = load_split(data_dir / name, model.input_size, model.class_names, max_images)
        detections = predict_split(model, split, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS)
        rows += [count_split(name, split, detections, replace(shipped, score_ratio=ratio))
                 for ratio in score_ratios]
    return rows


def markdown_table(rows: Sequence[SuppressionCounts]) -> str:
    """The report as a Markdown table."""
    lines = ['| split | score ratio | suppressed | false positives | known lost | '
             'unknown lost | ignored lost |', '|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(
            f'| {r.split} | {r.score_ratio:g} | {r.suppressed}/{r.detections} | '
            f'{r.false_positives_before} → {r.false_positives_after} | '
            f'{r.known_lost}/{r.known_found} | {r.unknown_lost}/{r.unknown_found} | '
            f'{r.ignored_lost}/{r.ignored_found} |')
    return '\n'.join(lines)


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'not a number: {text!r}') from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f'a score ratio is in [0, 1), got {text}')
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Duplicate-box suppression on simulator splits: what it removes and loses (JSON)."""
    parser.add_argument('--data', type=Path, required=True,
                        help='dataset directory (`uq sim dataset --out DIR`)')
    parser.add_argument('--splits', nargs='+', default=list(DEFAULT_SPLITS),
                        help='splits to count')
    parser.add_argument('--model', type=Path, default=Path('models/detector.pt'))
    parser.add_argument('--score-ratios', type=_ratio, nargs='+',
                        default=list(DEFAULT_SCORE_RATIOS), metavar='R',
                        help='settings of the part rule (0: off); the other thresholds '
                        'are the shipped ones')
    parser.add_argument('--max-images', type=positive_int, default=None,
                        help='only the first images of each split (quick runs)')
    parser.add_argument('--threads', type=positive_int, default=1, help='torch CPU threads')
    parser.add_argument('--out', type=Path, default=None, help='also write the JSON here')
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    import torch

    from uq_eval.detector.scoring import print_json_report

    for name in args.splits:
        if not (args.data / name / 'annotations.json').is_file():
            print(f'uq eval duplicates: {args.data / name} is not a split (make one with '
                  f'`uq sim dataset --out {args.data}`)', file=sys.stderr)
            return 2
    if not args.model.is_file():
        print(f'uq eval duplicates: {args.model} is not a file', file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    try:
        rows = study(args.model, args.data, args.splits, args.score_ratios, args.max_images)
    except ValueError as exc:  # a malformed split or model file: one line, no traceback
        print(f'uq eval duplicates: {exc}', file=sys.stderr)
        return 2
    print(markdown_table(rows), file=sys.stderr)
    report: dict[str, Any] = {'rows': [asdict(r) for r in rows]}
    print_json_report(report, args.out)
    return 0
