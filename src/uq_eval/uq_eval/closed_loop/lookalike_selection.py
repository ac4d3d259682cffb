"""Confident look-alikes: procedural unknowns the shipped detector takes for the target.

    python -m uq_eval.closed_loop.lookalike_selection                  # 600 candidates, ≈ 7 min
    python -m uq_eval.closed_loop.lookalike_selection --candidates 12 --out out/selection.json

The rule, applied to procedural look-alike shapes ``0 .. N-1`` of
:func:`uq_sim.grasp_task.lookalike_shape_rng` (the held-out families take turns): shape
``k`` is put in the look-alike's place of :data:`SELECTION_VIEWS` grasp-task trials
(:func:`selection_seed`: other places and neighbours, so other views); in each, the gripper is
rendered at :data:`REACH_FRACTIONS` of the way from its home to the shape (the path a
policy that reaches for it takes), and each frame goes through the detector node's
pipeline with the shipped model and GP. A frame *reads the shape as the target* when a
detection matches it (IoU >= 0.5) whose class is the target class with a class probability
of at least :data:`MIN_TARGET_PROBABILITY` (the ``class_id`` and ``class_probabilities`` the
node publishes). A selection trial *passes* when at least :data:`MIN_FRAME_SHARE` of its
frames read the shape so, and the shape is a *confident look-alike* when at least
:data:`MIN_PASSED_VIEWS` of its :data:`SELECTION_VIEWS` selection trials pass (the screen
stops as soon as the verdict is known). Requiring every trial left a single shape of 600:
a shape the detector takes for the target from most places is still one a policy that
trusts the class reaches for, and the hard suite needs several of them.

The shapes are chosen in trials ``SELECTION_SEED_BASE ..`` and evaluated by
``uq eval shared-autonomy --suite hard`` in trials from ``--seed`` on, which must stay
below :data:`SELECTION_SEED_BASE`: the benchmark's places, neighbours and views are not
the ones the shapes were chosen in. The chosen list is shipped in :data:`SHIPPED_SELECTION`.
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

from uq_common.arguments import positive_int

WORKSPACE = Path(__file__).resolve().parents[4]
SHIPPED_SELECTION = WORKSPACE / 'config' / 'confident_lookalikes.json'
REACH_FRACTIONS = (0.0, 0.2, 0.4, 0.6, 0.8)
MIN_TARGET_PROBABILITY = 0.9
MIN_FRAME_SHARE = 0.8
MATCH_IOU = 0.5
SELECTION_SEED_BASE = 100_000
SELECTION_VIEWS = 3
MIN_PASSED_VIEWS = 2
MAX_CANDIDATES = 100_000  # selection trials of view j: SELECTION_SEED_BASE + j * this + k
DEFAULT_CANDIDATES = 600


def selection_seed(shape: int, view: int) -> int:
    """The grasp-task trial in which shape ``shape`` is screened for the ``view``-th time."""
    return SELECTION_SEED_BASE + view * MAX_CANDIDATES + shape


def reads_as_target(class_read: str | None, target_probability: float,
                    target_class: str) -> bool:
    """Whether one frame's detection of the shape counts as a confident target reading."""
    return class_read == target_class and target_probability >= MIN_TARGET_PROBABILITY


def passes_rule(frames: Sequence[bool]) -> bool:
    """Whether one selection trial passes: at least MIN_FRAME_SHARE of its frames (a frame
    without a matching detection counts as not read as the target) read the shape so.

    Raises
    ------
    ValueError
        If there are no frames.
    """
    if not frames:
        raise ValueError('the rule needs at least one frame')
    return sum(frames) >= MIN_FRAME_SHARE * len(frames) - 1e-9


def passes_views(views: Sequence[bool]) -> bool | None:
    """The shape's verdict from the selection trials screened so far (True: passed);
    None while the trials left could still change it."""
    passed = sum(views)
    if passed >= MIN_PASSED_VIEWS:
        return True
    if passed + SELECTION_VIEWS - len(views) < MIN_PASSED_VIEWS:
        return False
    return None


def screen_shape(shape: int, renderer: Any, perception: Any, target_class: str) -> dict:
    """Screen shape ``shape`` in its selection trials until its verdict is known; its row."""
    views: list[dict] = []
    verdict = None
    while verdict is None:
        views.append(screen_view(selection_seed(shape, len(views)), shape, renderer,
                                 perception, target_class))
        verdict = passes_views([v['passed'] for v in views])
    return {'shape': shape, 'family': views[0]['family'], 'views': views, 'passed': verdict}


def screen_view(seed: int, shape: int, renderer: Any, perception: Any,
                target_class: str) -> dict:
    """Render shape ``shape`` along the reach path of trial ``seed``; the frames' reads."""
    from uq_perception.training.detection_metrics import box_iou
    from uq_sim.grasp_task import GRIPPER_HOME, make_trial

    trial = make_trial(seed, lookalike_shape=shape)
    lookalike = trial.lookalike_object
    assert lookalike is not None  # a trial with a look-alike shape holds one
    renderer.load(trial.scene_spec())
    home = np.array(GRIPPER_HOME)
    frames = []
    for fraction in REACH_FRACTIONS:
        x, y = home + fraction * (np.array(lookalike.xy) - home)
        renderer.set_gripper_pose((x, y, 0.12), math.pi / 2)
        frame = renderer.render(visibility=False)
        result = perception.process(frame.rgb)
        read: dict[str, Any] = {'class': None, 'target_probability': 0.0,
                                'calibrated_score': None}
        mine = [a for a in frame.annotations if a.name == lookalike.name]
        if mine and len(result):
            x0, y0, w, h = mine[0].bbox
            iou = box_iou(np.array([[x0 + w / 2, y0 + h / 2, w, h]], float),
                          np.asarray(result.detections.boxes, float).reshape(-1, 4))[0]
            i = int(iou.argmax())
            if iou[i] >= MATCH_IOU:
                probabilities = result.uncertainty.probabilities[i]
                read['class'] = result.class_names[int(probabilities.argmax())]
                if target_class in result.class_names:
                    read['target_probability'] = round(float(
                        probabilities[result.class_names.index(target_class)]), 4)
                if result.uncertainty.calibrated_score is not None:
                    read['calibrated_score'] = round(float(
                        result.uncertainty.calibrated_score[i]), 4)
        read['as_target'] = reads_as_target(read['class'], read['target_probability'],
                                            target_class)
        frames.append(read)
    return {'family': lookalike.class_name, 'trial_seed': trial.seed, 'frames': frames,
            'passed': passes_rule([f['as_target'] for f in frames])}


def screen(shapes: Sequence[int], perception: Any, target_class: str,
           progress: bool = False) -> list[dict]:
    """One row per shape (see :func:`screen_shape`)."""
    from tqdm import tqdm

    from uq_sim.scene import SceneRenderer

    with SceneRenderer(320, 240) as renderer:
        return [screen_shape(shape, renderer, perception, target_class)
                for shape in tqdm(shapes, desc='screen look-alike shapes', unit='shape',
                                  disable=not progress)]


def selection_report(rows: Sequence[dict], target_class: str, command: str) -> dict:
    """The shipped selection file's content."""
    return {
        'command': command,
        'rule': {'target_class': target_class, 'reach_fractions': list(REACH_FRACTIONS),
                 'min_target_probability': MIN_TARGET_PROBABILITY,
                 'min_frame_share': MIN_FRAME_SHARE, 'match_iou': MATCH_IOU,
                 'selection_views': SELECTION_VIEWS, 'min_passed_views': MIN_PASSED_VIEWS,
                 'selection_seed_base': SELECTION_SEED_BASE},
        'candidates': len(rows),
        'passed': [r['shape'] for r in rows if r['passed']],
        'passed_per_family': {family: sum(r['passed'] for r in rows if r['family'] == family)
                              for family in sorted({r['family'] for r in rows})},
        'rows': list(rows),
    }


def selection_json(report: dict) -> str:
    """The report as JSON text: the summary indented, one line per screened shape."""
    head = {k: v for k, v in report.items() if k != 'rows'}
    text = json.dumps(head, indent=1)[:-2]
    rows = ',\n  '.join(json.dumps(row, separators=(',', ':')) for row in report['rows'])
    return f'{text},\n "rows": [\n  {rows}\n ]\n}}\n'


def load_selection(path: Path = SHIPPED_SELECTION) -> dict:
    """The selection written by this module's command.

    Raises
    ------
    ValueError
        If the file is missing, not JSON, or names no passing shape.
    """
    try:
        selection = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f'cannot read the look-alike selection {path}: {exc}') from None
    passed = selection.get('passed') if isinstance(selection, dict) else None
    if not isinstance(passed, list) or not passed or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in passed):
        raise ValueError(f'{path}: "passed" must list at least one shape number')
    return selection


def _candidate_count(text: str) -> int:
    count = positive_int(text)
    if count > MAX_CANDIDATES:
        raise argparse.ArgumentTypeError(f'at most {MAX_CANDIDATES} candidates, got {count}')
    return count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m uq_eval.closed_loop.lookalike_selection',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--candidates', type=_candidate_count, default=DEFAULT_CANDIDATES,
                        help=f'shapes 0 .. N-1 screened (N <= {MAX_CANDIDATES})')
    parser.add_argument('--out', type=Path, default=SHIPPED_SELECTION)
    args = parser.parse_args(argv)
    from uq_eval.bags.evaluation import load_shipped_perception
    from uq_sim.grasp_task import TARGET_CLASS

    rows = screen(range(args.candidates), load_shipped_perception(), TARGET_CLASS,
                  progress=True)
    command = ' '.join(['python -m uq_eval.closed_loop.lookalike_selection',
                        *(argv if argv is not None else sys.argv[1:])])
    report = selection_report(rows, TARGET_CLASS, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(selection_json(report))
    print(f"{len(report['passed'])} of {report['candidates']} candidate shapes passed "
          f"({report['passed_per_family']}): {report['passed']}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
