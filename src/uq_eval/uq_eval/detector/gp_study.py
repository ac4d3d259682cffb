"""Which GP on the detector's features separates unknown objects (``uq eval detector-gp``).

A study, not a model choice: every variant below is fitted on the training split's known
objects (one on the validation split's), as the shipped GP is, and its GP-variance
known-vs-unknown AUROC is reported on the fixed unknown set (``test_unknown``) and on
procedurally generated unknown objects (``uq_eval.detector.procedural_unknowns``). Nothing is chosen
on those sets; the one free weight (of the two-layer kernel) is chosen by the log evidence.

Variants, each a last-layer NTK-GP (``uq_perception.ntk.LastLayerNTKGP``, hyperparameters by
marginal likelihood unless stated):

- **kernel**: over ``phi`` (the shipped GP); over the embedding MLP's hidden units or its
  input (the box's sampled feature map and context cell), each put on a sphere as ``phi``
  is; over ``phi`` and the hidden units together, ``k = phi.phi' + g^2 h.h'``: the NTK of
  the last two layers with the hidden layer's back-propagated factor left out;
- **gating**: k-means with 2, 4 or 8 experts, one expert per class;
- **prior precision**: the evidence's value times 0.1, 10 or 100;
- **fit data**: the objects of the validation images, which the network never trained on.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_common.arguments import positive_int

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.training.detector_data import DetectionSplit

Features = dict[str, np.ndarray]

# Weights g of the hidden units in the two-layer kernel; the log evidence picks one.
TWO_LAYER_WEIGHTS = (0.25, 0.5, 1.0, 2.0)
PRIOR_PRECISION_FACTORS = (0.1, 10.0, 100.0)
KMEANS_EXPERTS = (2, 4, 8)


@dataclass(frozen=True)
class UnknownSet:
    """Matched detections of one evaluation split: features, classes and predictions."""

    name: str
    features: Features
    labels: np.ndarray  # (N,) class of the matched object; -1 for an unknown object
    predicted: np.ndarray  # (N,) the network's most probable class

    @property
    def unknown(self) -> np.ndarray:
        return self.labels < 0


@dataclass(frozen=True)
class VariantResult:
    """One GP variant: how it was fitted and its AUROC on each unknown set."""

    group: str
    variant: str
    fit_objects: int
    log_evidence: float
    auroc: dict[str, float | None]


def on_sphere(features: np.ndarray) -> np.ndarray:
    """Rows scaled to norm ``sqrt(width)``, as the detector scales ``phi``; zero rows stay 0."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features * (math.sqrt(features.shape[1]) / np.where(norms > 0, norms, 1.0))


def two_layer(weight: float) -> Callable[[Features], np.ndarray]:
    """Features of the two-layer kernel ``phi.phi' + weight^2 h.h'`` (``h`` on a sphere)."""
    return lambda f: np.hstack([f['phi'], weight * on_sphere(f['hidden'])])


KERNELS: dict[str, Callable[[Features], np.ndarray]] = {
    'phi (shipped)': lambda f: f['phi'],
    'hidden units': lambda f: on_sphere(f['hidden']),
    'MLP input': lambda f: on_sphere(f['mlp_input']),
}


def unknown_set(model: CenterNetDetector, split: DetectionSplit, progress: bool) -> UnknownSet:
    """Features of the detections that match not-ignored objects, at the operating point."""
    from uq_eval.detector.scoring import matched_objects
    from uq_perception.training.detection_scoring import (
        OPERATING_MAX_DETECTIONS,
        OPERATING_THRESHOLD,
        predict_split,
    )
    from uq_perception.training.train import recorded_embedding_layers

    with recorded_embedding_layers(model) as calls:
        dets = predict_split(model, split, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
                             progress=progress)
    # One embed_cells call per batch, (B, K, width); detection d of an image is candidate d.
    layers = {name: np.concatenate([call[name] for call in calls]) for name in calls[0]} \
        if calls else {}
    rows: dict[str, list[np.ndarray]] = {name: [] for name in ('phi', *layers)}
    labels, predicted = [], []
    for i, det_index, obj_index in matched_objects(split, dets):
        rows['phi'].append(dets[i].embeddings[det_index])
        for name, values in layers.items():
            rows[name].append(values[i, det_index])
        labels.append(split.labels[i][obj_index])
        predicted.append(dets[i].logits[det_index].argmax(axis=1))
    if not labels:
        raise ValueError(f'no detection of {split.name} matches an object')
    return UnknownSet(split.name, {name: np.concatenate(v) for name, v in rows.items()},
                      np.concatenate(labels), np.concatenate(predicted))


def known_tail(variance: np.ndarray, scored: UnknownSet, share: float = 0.05
               ) -> dict[str, float | None]:
    """How much of the AUROC the most uncertain known detections cost, and what they are.

    Returns the AUROC with and without the ``share`` of known detections with the highest
    variance, and the fraction of misclassified detections among those and among all known
    ones.
    """
    from uq_eval.detector.scoring import safe_auroc
    from uq_perception.training.detection_scoring import rounded

    known = ~scored.unknown
    if not known.any():
        return {}
    cut = np.quantile(variance[known], 1.0 - share)
    tail = known & (variance > cut)
    keep = ~tail
    wrong = scored.predicted != scored.labels
    return {'auroc': safe_auroc(variance, scored.unknown),
            'auroc_without_tail': safe_auroc(variance[keep], scored.unknown[keep]),
            'tail_share': share,
            'misclassified_in_tail': rounded(float(wrong[tail].mean())) if tail.any() else None,
            'misclassified_in_known': rounded(float(wrong[known].mean()))}


def run_study(model: CenterNetDetector, train: tuple[Features, np.ndarray],
              held_out: tuple[Features, np.ndarray], unknown_sets: Sequence[UnknownSet],
              seed: int = 0, log: Callable[[str], None] = print) -> list[VariantResult]:
    """Fit every variant and score it on every unknown set (module docstring)."""
    from uq_eval.detector.scoring import safe_auroc
    from uq_perception.ntk import Gating, LastLayerNTKGP, NTKGPConfig

    weight = model.head.weight.detach().cpu().numpy()
    bias = model.head.bias.detach().cpu().numpy()
    results: list[VariantResult] = []

    def fit(features: np.ndarray, labels: np.ndarray, gating: Gating = Gating.KMEANS,
            experts: int = 1) -> LastLayerNTKGP:
        # The head's weights give the GP's mean, which the variance does not use; a kernel
        # over other features gets a zero mean of their width.
        mean_weight = weight if features.shape[1] == weight.shape[1] else \
            np.zeros((weight.shape[0], features.shape[1]))
        config = NTKGPConfig(num_experts=weight.shape[0] if gating is Gating.CLASS
                             else experts, gating=gating, seed=seed)
        return LastLayerNTKGP(mean_weight, bias, config=config).fit(features, labels)

    def score(group: str, variant: str, gp: LastLayerNTKGP, objects: int,
              features_of: Callable[[Features], np.ndarray]) -> None:
        evidence = sum(gp.log_marginal_likelihood(e) for e in range(gp.num_experts))
        result = VariantResult(group, variant, objects, round(float(evidence), 1), {
            s.name: safe_auroc(gp.gp_variance(features_of(s.features)), s.unknown)
            for s in unknown_sets})
        results.append(result)
        log(f'{group}: {variant}: ' + ', '.join(
            f'{name} {value}' for name, value in result.auroc.items()))

    train_features, train_labels = train
    objects = len(train_labels)
    for name, features_of in KERNELS.items():
        score('kernel', name, fit(features_of(train_features), train_labels), objects,
              features_of)
    two_layer_fits = {g: fit(two_layer(g)(train_features), train_labels)
                      for g in TWO_LAYER_WEIGHTS}
    best = max(two_layer_fits, key=lambda g: two_layer_fits[g].log_marginal_likelihood(0))
    score('kernel', f'phi and hidden units, g = {best} (by evidence from '
          f'{", ".join(map(str, TWO_LAYER_WEIGHTS))})', two_layer_fits[best], objects,
          two_layer(best))

    phi = KERNELS['phi (shipped)']
    for experts in KMEANS_EXPERTS:
        score('gating', f'k-means x {experts}', fit(phi(train_features), train_labels,
                                                   experts=experts), objects, phi)
    score('gating', 'one expert per class', fit(phi(train_features), train_labels,
                                                Gating.CLASS), objects, phi)

    shipped = fit(phi(train_features), train_labels)
    sigma2, delta = float(shipped.sigma2[0]), float(shipped.delta[0])
    for factor in PRIOR_PRECISION_FACTORS:
        shipped.set_hyperparameters(sigma2, delta * factor)
        score('prior precision', f'{factor:g} x evidence ({delta * factor:.4g})', shipped,
              objects, phi)

    held_features, held_labels = held_out
    score('fit data', 'validation objects (images not trained on)',
          fit(phi(held_features), held_labels), len(held_labels), phi)
    return results


def markdown_table(results: Sequence[VariantResult]) -> str:
    """The results as a Markdown table, one AUROC column per unknown set."""
    sets = list(results[0].auroc) if results else []
    lines = ['| group | variant | fit objects | log evidence | ' + ' | '.join(sets) + ' |',
             '|---|---|---|---|' + '---|' * len(sets)]
    for r in results:
        cells = ['-' if v is None else f'{v:.3f}' for v in r.auroc.values()]
        lines.append(f'| {r.group} | {r.variant} | {r.fit_objects} | {r.log_evidence:.0f} | '
                     + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def study(model_path: Path, gp_path: Path, data: Path, procedural_unknowns: int,
          procedural_seeds: Sequence[int], threads: int = 1, progress: bool = True,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Load the detector and the splits, extract the features, run :func:`run_study`."""
    import torch

    from uq_eval.detector.procedural_unknowns import render_procedural_split
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detector_data import load_split
    from uq_perception.training.train import object_features

    torch.set_num_threads(threads)
    started = time.perf_counter()
    model = load_detector(model_path, fold_batchnorm=False)
    model.eval()
    fit_sets = {}
    for name in ('train', 'val'):
        split = load_split(data / name, model.input_size, model.class_names)
        fit_sets[name] = object_features(model, split, progress=progress, with_layers=True)
        log(f'{name}: {len(fit_sets[name][1])} known objects')
    unknown_sets = [unknown_set(model, load_split(
        data / 'test_unknown', model.input_size, model.class_names), progress)]
    for seed in procedural_seeds:
        split = render_procedural_split(procedural_unknowns, seed, model.input_size,
                                        model.class_names, progress=progress)
        unknown_sets.append(unknown_set(model, split, progress))
    for s in unknown_sets:
        log(f'{s.name}: {int(s.unknown.sum())} unknown and {int((~s.unknown).sum())} known '
            f'detections')
    results = run_study(model, fit_sets['train'], fit_sets['val'], unknown_sets, log=log)
    shipped = LastLayerNTKGP.load(gp_path, feature_dim=model.embedding_dim,
                                  class_names=model.class_names, model_id=model.model_id)
    return {'model': str(model_path), 'model_id': model.model_id, 'data': str(data),
            'procedural_unknowns': procedural_unknowns,
            'procedural_seeds': list(procedural_seeds),
            'detections': {s.name: {'unknown': int(s.unknown.sum()),
                                    'known': int((~s.unknown).sum())} for s in unknown_sets},
            'results': [asdict(r) for r in results],
            # Where the shipped GP loses AUROC: its most uncertain known detections.
            'shipped_gp_known_tail': {s.name: known_tail(shipped.gp_variance(s.features['phi']),
                                                         s) for s in unknown_sets},
            'seconds': round(time.perf_counter() - started, 1)}


def configure(parser: argparse.ArgumentParser) -> None:
    """GP variants on the detector's features, scored on unknown objects (prints JSON)."""
    from uq_eval.detector.procedural_unknowns import (
        procedural_count_argument,
        procedural_seed_argument,
    )

    parser.add_argument('--data', type=Path, required=True,
                        help='dataset directory with train/, val/ and test_unknown/')
    parser.add_argument('--model', type=Path, default=Path('models/detector.pt'))
    parser.add_argument('--gp', type=Path, default=Path('models/detector_gp.npz'),
                        help='the shipped GP, whose known-detection tail is reported')
    parser.add_argument('--procedural-unknowns', type=procedural_count_argument, default=300,
                        metavar='N', help='procedural unknown objects per seed '
                        '(docs/simulation.md)')
    parser.add_argument('--procedural-seeds', type=procedural_seed_argument, nargs='*',
                        default=[0, 1], metavar='SEED',
                        help='seeds of the procedural sets (none: the fixed set only)')
    parser.add_argument('--threads', type=positive_int, default=1, help='torch CPU threads')
    parser.add_argument('--out', type=Path, default=None, help='also write the JSON here')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from uq_eval.detector.scoring import print_json_report

    for name in ('train', 'val', 'test_unknown'):
        if not (args.data / name).is_dir():
            print(f'uq eval detector-gp: {args.data / name} is missing (make it with '
                  f'`uq sim dataset --out {args.data}`)', file=sys.stderr)
            return 2
    for path in (args.model, args.gp):
        if not path.is_file():
            print(f'uq eval detector-gp: {path} is not a file', file=sys.stderr)
            return 2
    report = study(args.model, args.gp, args.data, args.procedural_unknowns, args.procedural_seeds,
                   threads=args.threads, progress=not args.no_progress,
                   log=lambda line: print(line, file=sys.stderr, flush=True))
    print(markdown_table([VariantResult(**r) for r in report['results']]), file=sys.stderr)
    for name, tail in report['shipped_gp_known_tail'].items():
        if tail:
            print(f'shipped GP on {name}: AUROC {tail["auroc"]}, {tail["auroc_without_tail"]} '
                  f'without the {tail["tail_share"]:.0%} most uncertain known detections '
                  f'(misclassified among those {tail["misclassified_in_tail"]}, among all '
                  f'known {tail["misclassified_in_known"]})', file=sys.stderr)
    print_json_report(report, args.out)
    return 0
