"""``uq gp diagnose``: why a detector's GP variance does or does not separate unknown objects.

The GP reads the detector's per-detection features ``phi``. Where its variance ranks unknown
objects poorly, three causes are candidates, and this study tells them apart on the user's
own model and data, from one pass of the detector over the training and validation images:

1. **Raw features.** The AUROC of the GP variance (one expert) on raw ``phi`` and on
   ``phi`` normalised per block, with and without centring (the artefact's feature
   transform); the AUROC of ``-||phi_s||`` (the norm of the detection's own block) and the
   rank correlation of the raw variance with it.
2. **Scales.** Counts of known and unknown detections and every AUROC per block (YOLO scale).
3. **Selection.** How many known and unknown objects are detected at all and at the node's
   score threshold, and every AUROC within bins of the detector's score: does the GP add to
   the confidence, or only restate it?

Beside them: the detector's own confidence (MSP, max logit, energy) on the same detections.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uq_eval.gp.fitting import ObjectFeatures
    from uq_perception.detectors.contract import DetectorContract

#: Detector-score bins of the selection study, and the node's default score threshold.
SCORE_BINS = ((0.05, 0.1), (0.1, 0.3), (0.3, 0.6), (0.6, 1.0))
NODE_THRESHOLD = 0.3


def _block_of(features: np.ndarray, blocks: Sequence[tuple[int, int, int | None]]
              ) -> np.ndarray:
    """Index of each row's block (-1: none)."""
    from uq_perception.ntk.feature_transform import FeatureBlock, rows_of

    owner = np.full(len(features), -1)
    for i, block in enumerate(blocks):
        owner[rows_of(features, FeatureBlock(*block))] = i
    return owner


def _block_norm(features: np.ndarray, blocks: Sequence[tuple[int, int, int | None]]
                ) -> np.ndarray:
    owner = _block_of(features, blocks)
    norms = np.full(len(features), np.nan)
    for i, (start, stop, _) in enumerate(blocks):
        rows = owner == i
        norms[rows] = np.linalg.norm(features[rows, start:stop], axis=1)
    return norms


def diagnose(detector: DetectorContract, train: ObjectFeatures, val: ObjectFeatures
             ) -> dict[str, Any]:
    """The study of the module docstring on already collected objects.

    ``train`` gives the GP's training objects (its known ones), ``val`` the known and
    unknown objects it is judged on. Returns a JSON-ready dict.
    """
    from uq_perception.detectors.contract import gp_head_arguments
    from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig
    from uq_perception.ntk.feature_transform import FeatureBlock, FeatureTransform
    from uq_perception.training.metrics import auroc
    from uq_perception.training.ood_baselines import energy_score, max_logit_score, msp_score

    blocks = detector.feature_blocks()
    train_x = train.features[train.known].astype(np.float64)
    train_y = train.labels[train.known]
    x, logits = val.features.astype(np.float64), val.logits.astype(np.float64)
    unknown = ~val.known
    if not unknown.any() or unknown.all():
        raise ValueError('the validation images need both known and unknown objects found '
                         '(mark unknown categories with --unknown)')

    scores: dict[str, np.ndarray] = {}
    for kind in ('none', 'l2', 'centre_l2'):
        gp = LastLayerNTKGP(config=NTKGPConfig(num_experts=1), **gp_head_arguments(detector))
        if kind != 'none':
            gp.feature_transform = FeatureTransform.fitted(
                train_x, [FeatureBlock(*b) for b in blocks], centre=kind == 'centre_l2')
        scores[f'gp_variance_{kind}'] = gp.fit(train_x, train_y).gp_variance(x)
    norm = _block_norm(x, blocks)
    scores['neg_block_norm'] = -norm
    scores['msp'] = msp_score(logits, detector.class_activation)
    scores['max_logit'] = max_logit_score(logits)
    scores['energy'] = energy_score(logits)
    confidence = 1.0 - scores['msp']

    def aurocs(rows: np.ndarray) -> dict[str, float | None]:
        if not (unknown[rows].any() and (~unknown[rows]).any()):
            return dict.fromkeys(scores)
        return {k: round(auroc(v[rows], unknown[rows]), 4) for k, v in scores.items()}

    def counts(rows: np.ndarray) -> dict[str, int]:
        return {'known': int((rows & ~unknown).sum()), 'unknown': int((rows & unknown).sum())}

    everything = np.ones(len(x), bool)
    variance_rank, norm_rank = (np.argsort(np.argsort(v)).astype(np.float64)
                                for v in (scores['gp_variance_none'], norm))
    owner = _block_of(x, blocks)
    train_owner = _block_of(train_x, blocks)
    return {
        'objects': {**counts(everything), 'train_known': int(len(train_y))},
        'auroc': aurocs(everything),
        'raw_variance_vs_block_norm_spearman': round(
            float(np.corrcoef(variance_rank, norm_rank)[0, 1]), 4),
        'block_norm_median': {'known': round(float(np.median(norm[~unknown])), 4),
                              'unknown': round(float(np.median(norm[unknown])), 4)},
        'per_block': [{'block': list(block), 'train_known': int((train_owner == i).sum()),
                       **counts(owner == i), 'auroc': aurocs(owner == i)}
                      for i, block in enumerate(blocks)],
        'per_score_bin': [{'bin': [low, high],
                           **counts((confidence >= low) & (confidence < high)
                                    | ((high == 1.0) & (confidence == 1.0))),
                           'auroc': aurocs((confidence >= low) & (confidence < high)
                                           | ((high == 1.0) & (confidence == 1.0)))}
                          for low, high in SCORE_BINS],
        'at_node_threshold': {**counts(confidence >= NODE_THRESHOLD),
                              'threshold': NODE_THRESHOLD},
    }


def format_summary(result: dict[str, Any]) -> str:
    """The study's headline lines, for the terminal."""
    objects, auc = result['objects'], result['auroc']
    lines = [f'{objects["known"]} known and {objects["unknown"]} unknown objects found '
             f'(score >= 0.05); at the node\'s threshold {NODE_THRESHOLD}: '
             f'{result["at_node_threshold"]["known"]} and '
             f'{result["at_node_threshold"]["unknown"]}',
             'known-vs-unknown AUROC: ' + ', '.join(f'{k} {v}' for k, v in auc.items()),
             f'raw GP variance vs the block norm: Spearman '
             f'{result["raw_variance_vs_block_norm_spearman"]}; block norm median known '
             f'{result["block_norm_median"]["known"]}, unknown '
             f'{result["block_norm_median"]["unknown"]}']
    for row in result['per_block']:
        lines.append(f'block {row["block"]}: {row["train_known"]} training, {row["known"]} '
                     f'known, {row["unknown"]} unknown')
    for row in result['per_score_bin']:
        auc = row['auroc']
        lines.append(f'score in [{row["bin"][0]}, {row["bin"][1]}): {row["known"]} known, '
                     f'{row["unknown"]} unknown; GP raw {auc["gp_variance_none"]}, centre_l2 '
                     f'{auc["gp_variance_centre_l2"]}, MSP {auc["msp"]}')
    return '\n'.join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Why a detector's GP variance does or does not separate its unknown objects."""
    from uq_eval.gp.fit_command import add_data_arguments, add_detector_arguments

    add_detector_arguments(parser)
    add_data_arguments(parser)
    parser.add_argument('--out', type=Path, default=None, help='also write the JSON here')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Collect once, study, print; bad input exits 2 with one line."""
    from uq_eval.gp.fit_command import _load_data, _one_line, open_detector
    from uq_eval.gp.fitting import FitSettings, collect_objects
    from uq_perception.runtime.onnx_runtime import OnnxRuntimeUnavailableError

    try:
        detector, info = open_detector(args)
        data = _load_data(args, detector.class_names)
        settings = FitSettings()
        progress = not args.no_progress
        train, _ = collect_objects(detector, data['train'], data['train_roles'], settings,
                                   progress, 'detections train')
        val, _ = collect_objects(detector, data['val'], data['val_roles'], settings, progress,
                                 'detections val')
        result = {'model': info, 'data': data['provenance'], **diagnose(detector, train, val)}
    except (ValueError, OSError, OnnxRuntimeUnavailableError) as exc:
        print(f'uq gp diagnose: error: {_one_line(exc)}', file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + '\n', encoding='utf-8')
    log(format_summary(result))
    return 0
