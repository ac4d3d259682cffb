"""The calibrated scores the shipped detector gives the objects of the grasp task.

    python -m uq_eval.closed_loop.task_scores                     # 30 trials, 5 gripper positions
    python -m uq_eval.closed_loop.task_scores --trials 5 --json out/task_scores.json

Renders the trials of :mod:`uq_sim.grasp_task` (seeds ``--seed`` onwards, the look-alike
drawn as in ``uq eval shared-autonomy``) with the gripper at fractions of the way from its
home to the target, runs the detector node's pipeline (the shipped model and GP) on each
frame, matches the detections to the rendered objects (IoU >= 0.5) and reports, per role
(target, look-alike, distractor): how often the object was detected, how often it was read
as the target class, and percentiles of its calibrated score. These are the values the
arbitration node judges under ``driving_detection: autonomy_target`` when the autonomy
reaches for that object; the hysteresis of ``config/shared_autonomy.yaml`` is set from
them (docs/shared_autonomy.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uq_common.arguments import non_negative_int, positive_int

ROLES = ('target', 'lookalike', 'distractor')
PERCENTILES = (10, 50, 90, 100)
DEFAULT_FRACTIONS = (0.0, 0.3, 0.6, 0.85, 1.0)
MATCH_IOU = 0.5


def _role(name: str) -> str:
    return 'distractor' if name.startswith('distractor') else name


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f'a fraction in [0, 1], got {text!r}')
    return value


def object_scores(seeds: Sequence[int], fractions: Sequence[float],
                  perception: Any) -> list[dict]:
    """One row per rendered object of every frame: its trial, gripper fraction, role, and,
    when a detection matches it, the class read and the calibrated score (else None)."""
    from uq_perception.training.detection_metrics import box_iou
    from uq_sim.grasp_task import GRIPPER_HOME, make_trial
    from uq_sim.scene import SceneRenderer

    rows = []
    home = np.array(GRIPPER_HOME)
    with SceneRenderer(320, 240) as renderer:
        for seed in seeds:
            trial = make_trial(seed)
            target = trial.target
            assert target is not None  # a trial drawn without target_absent holds one
            renderer.load(trial.scene_spec())
            for fraction in fractions:
                x, y = home + fraction * (np.array(target.xy) - home)
                renderer.set_gripper_pose((x, y, 0.12), math.pi / 2)
                frame = renderer.render(visibility=False)
                result = perception.process(frame.rgb)
                unc = result.uncertainty
                truth = np.array([[a.bbox[0] + a.bbox[2] / 2, a.bbox[1] + a.bbox[3] / 2,
                                   a.bbox[2], a.bbox[3]] for a in frame.annotations], float)
                iou = box_iou(truth.reshape(-1, 4), np.asarray(
                    result.detections.boxes, float).reshape(-1, 4))
                for k, annotation in enumerate(frame.annotations):
                    row: dict[str, Any] = {'seed': seed, 'fraction': fraction,
                                           'role': _role(annotation.name),
                                           'class_read': None, 'score': None}
                    if iou.shape[1] and iou[k].max() >= MATCH_IOU:
                        i = int(iou[k].argmax())
                        row['class_read'] = result.class_names[int(unc.probabilities[i].argmax())]
                        if unc.calibrated_score is not None:
                            row['score'] = float(unc.calibrated_score[i])
                    rows.append(row)
    return rows


def summarise(rows: Sequence[dict], target_class: str) -> dict[str, dict]:
    """Per role: objects seen, detected, read as ``target_class``, score percentiles
    (over the detected ones with a score; the target-class reads apart too)."""
    out = {}
    for role in ROLES:
        seen = [r for r in rows if r['role'] == role]
        detected = [r for r in seen if r['class_read'] is not None]
        as_target = [r for r in detected if r['class_read'] == target_class]

        def percentiles(items: list[dict]) -> dict[str, float] | None:
            scores = [r['score'] for r in items if r['score'] is not None]
            if not scores:
                return None
            return {f'p{p}': float(np.percentile(scores, p)) for p in PERCENTILES}
        out[role] = {'objects': len(seen), 'detected': len(detected),
                     'read_as_target': len(as_target), 'score': percentiles(detected),
                     'score_read_as_target': percentiles(as_target)}
    return out


def markdown(summary: dict[str, dict], target_class: str, command: str) -> str:
    """The summary as a table."""
    def cell(p: dict[str, float] | None) -> str:
        return '—' if p is None else ' / '.join(f'{p[f"p{q}"]:.3f}' for q in PERCENTILES)
    lines = [f'`{command}`', '',
             f'| object | frames | detected | read as {target_class} | calibrated score '
             f'p10 / p50 / p90 / max | when read as {target_class} |', '|---|---|---|---|---|---|']
    for role, s in summary.items():
        lines.append(f"| {role} | {s['objects']} | {s['detected']} | {s['read_as_target']} | "
                     f"{cell(s['score'])} | {cell(s['score_read_as_target'])} |")
    return '\n'.join(lines) + '\n'


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m uq_eval.closed_loop.task_scores',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--trials', type=positive_int, default=30, help='trials rendered')
    parser.add_argument('--seed', type=non_negative_int, default=0, help='first trial seed')
    parser.add_argument('--fractions', type=_fraction, nargs='+',
                        default=list(DEFAULT_FRACTIONS),
                        help='gripper positions, as fractions of the way home -> target')
    parser.add_argument('--json', type=Path, default=None, help='also write the rows here')
    args = parser.parse_args(argv)
    from uq_eval.bags.evaluation import load_shipped_perception
    from uq_sim.grasp_task import TARGET_CLASS

    perception = load_shipped_perception()
    rows = object_scores(range(args.seed, args.seed + args.trials), args.fractions, perception)
    summary = summarise(rows, TARGET_CLASS)
    command = ' '.join(['python -m uq_eval.closed_loop.task_scores',
                        *(argv if argv is not None else sys.argv[1:])])
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({'command': command, 'summary': summary,
                                         'rows': rows}, indent=1))
    print(markdown(summary, TARGET_CLASS, command))
    return 0


if __name__ == '__main__':
    sys.exit(main())
