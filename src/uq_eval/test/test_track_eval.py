"""`uq eval tracks`: evidence over a track on approach sequences, per detection and per
track."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from uq_eval.closed_loop.lookalike_selection import MAX_CANDIDATES, SELECTION_VIEWS, selection_seed
from uq_eval.detector.track_evaluation import (
    TRACK_SCORES,
    DetectionRecord,
    metrics,
    node_perception,
    scene_seed,
    summarize_tracks,
)
from uq_perception.track_evidence import TrackEvidence

WORKSPACE = Path(__file__).resolve().parents[3]
MODELS = WORKSPACE / 'models'

# Per track: whether its object is unknown and its calibrated score per frame. Each frame's
# box moves by a fifth of its diagonal (a new view), except where ``None`` marks a frame
# of the same view (the robot stood still), whose score is the second value.
KNOWN, UNKNOWN = False, True
TRACKS: dict[tuple[int, int], tuple[bool, list[float | tuple[None, float]]]] = {
    # scene 0: a known object with one strange view last, an unknown one ending familiar.
    (0, 0): (KNOWN, [0.2, 0.3, 0.9, (None, 0.95)]),
    (0, 1): (UNKNOWN, [0.8, 0.7, 0.5]),
    # scene 1: the same pattern.
    (1, 0): (KNOWN, [0.1, 0.2, 0.6]),
    (1, 1): (UNKNOWN, [0.9, 0.8, 0.55]),
}


def _records() -> list[DetectionRecord]:
    """The tracks above through the node's evidence, as the evaluation records them."""
    records = []
    for scene in (0, 1):
        evidence = TrackEvidence()
        ids = [t for s, t in TRACKS if s == scene]
        box = {t: np.array([100.0 + 80 * t, 100.0, 40.0, 30.0]) for t in ids}
        for frame in range(max(len(TRACKS[scene, t][1]) for t in ids)):
            present = [t for t in ids if frame < len(TRACKS[scene, t][1])]
            scores = []
            for t in present:
                step = TRACKS[scene, t][1][frame]
                if isinstance(step, tuple):
                    scores.append(step[1])
                else:
                    box[t] = box[t] + np.array([10.0, 0.0, 0.0, 0.0])
                    scores.append(step)
            out = evidence.update(frame * 0.5, np.array(present), np.zeros(len(present), int),
                                  np.array([box[t] for t in present]), np.array(scores))
            for d, t in enumerate(present):
                records.append(DetectionRecord(scene, 'test', frame, t, scores[d],
                                               float(out.score[d]), int(out.views[d]),
                                               TRACKS[scene, t][0], f'object{t}'))
    return records


def test_the_track_score_is_the_mean_over_views_not_the_last_frame():
    records = _records()
    tracks, left = summarize_tracks(records)
    assert left == {'superseded': 0, 'unmatched': 0, 'mixed': 0}
    assert len(tracks) == 4
    for track in tracks:
        views = [s for s in TRACKS[track.scene, track.track_id][1] if not isinstance(s, tuple)]
        assert track.track_score == pytest.approx(np.mean(views))
        assert track.views == len(views)
    # The known track's last, stationary frame is not a view: it moves the mean over frames
    # but not the track score.
    first = next(t for t in tracks if (t.scene, t.track_id) == (0, 0))
    assert first.frames == 4 and first.views == 3
    assert first.mean == pytest.approx(np.mean([0.2, 0.3, 0.9, 0.95]))
    assert first.max == 0.95 and first.first == 0.2
    report = metrics(records, set(), scenes=2, frames=4, bootstrap=50)
    # Every unknown track's mean over views is above every known one's, while each unknown
    # track ends below the known track of its scene: scored by the last frame, the AUROC
    # would be 0.
    assert report['auroc_per_track']['track_score']['auroc'] == 1.0
    last = {(r.scene, r.track_id): r.calibrated for r in records}
    unknown_last = [last[k] for k, (unknown, _) in TRACKS.items() if unknown]
    known_last = [last[k] for k, (unknown, _) in TRACKS.items() if not unknown]
    assert max(unknown_last) < min(known_last)
    # One frame at a time the two overlap.
    assert report['auroc_per_detection']['calibrated_score'] < 0.9
    assert set(report['auroc_per_track']) == set(TRACK_SCORES)
    assert report['counts']['scored_known_tracks'] == 2
    assert report['counts']['scored_unknown_tracks'] == 2
    assert report['counts']['views_per_track']['max'] == 3
    # The known tracks' scores are 0.467 and 0.3: their 0.9 quantile lies between, and both
    # unknown tracks (0.667, 0.75) lie above it.
    quantile = report['known_track_quantiles'][0]
    assert quantile['level'] == 0.9
    assert quantile['known_quantile'] == pytest.approx(0.3 + 0.9 * (0.4667 - 0.3), abs=1e-3)
    assert quantile['unknown_above'] == 1.0
    low, high = report['auroc_per_track']['track_score']['interval95']
    assert low <= 1.0 <= high


def test_tracks_are_labelled_by_most_of_their_matched_detections():
    def record(track: int, unknown: bool | None, score: float = 0.5, name: str = 'a'):
        return DetectionRecord(0, 'test', 0, track, score, score, 1, unknown, name)

    records = [
        record(0, True), record(0, True, name='b'), record(0, False), record(0, None),
        record(1, None), record(1, None),          # matched to no object: left out
        record(2, False), record(2, True, name='b'),  # a tie is no majority: known
        record(3, True),                           # its evidence went on in a later track
        record(4, False, score=-1.0),              # no calibrated score: left out
    ]
    tracks, left = summarize_tracks(records, {(0, 3)})
    assert {t.track_id: t.unknown for t in tracks} == {0: True, 2: False}
    assert left == {'superseded': 1, 'unmatched': 2, 'mixed': 2}
    assert next(t for t in tracks if t.track_id == 0).matched == 3


def test_the_pipeline_runs_at_the_node_defaults():
    params = yaml.safe_load((WORKSPACE / 'config' / 'detector.yaml').read_text())[
        'detector_node']['ros__parameters']
    stand_in = SimpleNamespace(feature_dim=4)
    perception = node_perception(stand_in, stand_in)
    assert perception.score_threshold == params['score_threshold']
    assert perception.max_detections == params['max_detections']
    assert perception.tracker.iou_threshold == params['tracking_iou']
    config = perception.evidence.config
    for name in ('view_change', 'max_views', 'memory_s', 'reform_iou', 'reform_cosine'):
        assert getattr(config, name) == params[f'track_{name}'], name
    assert perception.duplicates is not None


def test_scene_seeds_lie_above_the_lookalike_selection():
    assert scene_seed(0, 0) > selection_seed(MAX_CANDIDATES - 1, SELECTION_VIEWS - 1)


@pytest.mark.parametrize('args, message', [
    (['--frames', '1'], 'frames must be 2..'),
    (['--scenes', '0'], 'must be'),
    (['--seed', '-1'], 'must be'),
])
def test_bad_options_exit_2(capsys, args, message):
    from uq_common.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(['eval', 'tracks', *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not (MODELS / 'detector.pt').is_file(),
                    reason='models/detector.pt is missing (it is committed; a partial checkout)')
def test_a_tiny_run_writes_the_report(tmp_path):
    proc = subprocess.run(
        [sys.executable, '-m', 'uq_common.cli', 'eval', 'tracks', '--scenes', '2',
         '--frames', '3', '--out', str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=WORKSPACE)
    assert proc.returncode == 0, proc.stderr
    assert '2/2 scenes' in proc.stderr
    report = json.loads((tmp_path / 'detector.json').read_text())
    for key in ('command', 'date', 'model', 'gp', 'load_average', 'settings',
                'auroc_per_detection', 'auroc_per_track', 'known_track_quantiles',
                'known_detection_quantiles', 'per_kind', 'auroc_per_detection_by_frame',
                'counts'):
        assert key in report, key
    assert report['counts']['scenes'] == 2 and report['counts']['frames'] == 6
    assert set(report['per_kind']) == {'confident_lookalike', 'torus_lookalike'}
    assert report['settings']['confident_lookalike_shapes']
    assert [q['level'] for q in report['known_track_quantiles']] == [0.9, 0.95, 0.99]
    summary = (tmp_path / 'detector.md').read_text()
    assert '| per track: track score' in summary
    assert summary.strip() in proc.stdout
