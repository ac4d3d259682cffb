"""What the layers before the last add to a detector's known-vs-unknown score
(``uq eval layers``).

The detector node's GP reads ``phi``, the input of the class layer. This study reads the
layers before it from the same forward pass (an ONNX detector through
:class:`~uq_perception.runtime.onnx_layers.OnnxLayerDetector`: the class branch, the neck's
maps feeding the head, tensors named with ``--onnx-feature-nodes``; the shipped CenterNet
through forward hooks: backbone stages, neck, embedding map, the embedding MLP), and puts
every candidate score beside the logits' energy on the same detections:

- ``ntk_penultimate``, ``ntk_last_two``: the NTK of the class branch's layer before the last
  (alone, and added to the last layer's), in the engine's weight-space form over a sketch of
  its Jacobian features (:mod:`uq_perception.ntk.layer_kernel`);
- ``gp_layer:<map>``: one GP per tapped map, on box-pooled features, and on the penultimate
  layer's input at the anchor (``penultimate_input``); ``gp_experts``: all of them and the
  last layer's, each expert's score its quantile among the known validation
  detections, combined by their mean or maximum;
- ``gradnorm`` (the L1 norm of the gradient of the KL divergence to the uniform
  distribution with respect to the last layer, ``|p - u|_1 |[phi; 1]|_1``, low for
  unknown objects) and ``fusion_energy`` (a weighted mean of the quantiles of the energy
  and of a GP's variance among the known validation detections);
- ``gp_last``: a last-layer GP refitted on the same fit set as the others, and the GP the
  node ships (``gp_committed_score``: its published calibrated score);
- baselines: ``energy``, ``msp``, ``knn_pca`` (the distance to the k-th nearest fit feature
  after PCA and L2 normalisation, on any tapped map), ``safe_mlp`` (an MLP told clean
  known features from ones whose input to the penultimate layer was moved by one FGSM step
  of the class loss, as SAFE trains on perturbed features, here in feature space since an
  ONNX Runtime session gives no input gradient).

**Choosing without peeking.** The unknown objects of ``test_unknown`` are split by class:
images whose unknown objects are all of the SELECTION classes, and images whose unknown
objects are all of the JUDGING classes (images with both are left out), each with its own
known objects. Every option of every candidate (layer, pooling, PCA width, neighbour,
combination, fusion weight, perturbation size) and the one candidate put forward are
chosen on the selection images; the report gives each on the judging images and on
procedurally generated unknown objects, with 95 % bootstrap intervals (images resampled)
of AUROC, FPR95 and the AUROC difference to the energy. What is fitted (GPs, PCA, KNN,
MLP) is fitted on the known objects of a fit split alone; quantiles on the known objects of
``val``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_common.arguments import non_negative_int, positive_int

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.runtime.onnx_layers import OnnxLayerDetector
    from uq_perception.training.detector_data import DetectionSplit

#: Unknown classes of ``uq sim dataset`` that choose and that judge. Fixed before any score
#: was computed, from detection counts alone: the YOLOv8n detects at the node's threshold
#: nearly only tori and cones (110 and 87 of 208 unknown detections on ``test_unknown``), so
#: each side holds one of the two.
SELECTION_CLASSES = ('cone', 'tetrahedron', 'star')
JUDGING_CLASSES = ('torus', 'dumbbell')
#: Options chosen on the selection images.
FUSION_WEIGHTS = (0.25, 0.5, 0.75)
PCA_WIDTHS = (16, 64)
KNN_NEIGHBOURS = (1, 10, 50)
FGSM_STEPS = (0.25, 0.5, 1.0)
#: Weights of the penultimate block in ``ntk_last_two``; the log evidence (known objects
#: alone) picks one.
TWO_LAYER_WEIGHTS = (0.25, 0.5, 1.0, 2.0)
SKETCH_WIDTH = 1024
BOOTSTRAP = 1000


# ------------------------------------------------------------------------ the records


@dataclass(frozen=True)
class Records:
    """The matched detections of one split and what the taps read for each.

    Attributes
    ----------
    name
        The split.
    logits, phi
        ``(N, C)``, ``(N, D)``: the detector's own, as the node publishes them.
    labels
        ``(N,)`` class of the matched object, -1 for an unknown one.
    categories
        ``(N,)`` the matched object's category name.
    images
        ``(N,)`` index of the detection's image (the bootstrap's unit).
    layers
        Per tapped map, ``(N, width)`` box-pooled features; plus ``penultimate_input``,
        the input of the branch's layer before the last at the detection's anchor.
    scale
        ``(N,)`` the head's scale of the detection (0 for a single head).
    """

    name: str
    logits: np.ndarray
    phi: np.ndarray
    labels: np.ndarray
    categories: np.ndarray
    images: np.ndarray
    layers: dict[str, np.ndarray]
    scale: np.ndarray

    @property
    def unknown(self) -> np.ndarray:
        return self.labels < 0

    def features(self, layer: str) -> np.ndarray:
        """A tapped layer's features, or ``phi``."""
        return self.phi if layer == 'phi' else self.layers[layer]

    def subset(self, mask: np.ndarray, name: str | None = None) -> Records:
        return Records(name or self.name, self.logits[mask], self.phi[mask], self.labels[mask],
                       self.categories[mask], self.images[mask],
                       {k: v[mask] for k, v in self.layers.items()}, self.scale[mask])


class _Rows:
    """Accumulates per-detection arrays of a split."""

    def __init__(self) -> None:
        self.columns: dict[str, list[np.ndarray]] = {}

    def add(self, **arrays: np.ndarray) -> None:
        for key, value in arrays.items():
            self.columns.setdefault(key, []).append(np.asarray(value))

    def records(self, name: str) -> Records:
        if 'labels' not in self.columns:
            raise ValueError(f'no detection of {name} matches an object')
        c = {k: np.concatenate(v) for k, v in self.columns.items()}
        layers = {k[6:]: c[k] for k in c if k.startswith('layer:')}
        return Records(name, c['logits'].astype(np.float64), c['phi'].astype(np.float64),
                       c['labels'], c['categories'], c['images'], layers, c['scale'])


def _matched(split: DetectionSplit, i: int, boxes: np.ndarray, scores: np.ndarray,
             known_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """Detections of image ``i`` matched to not-ignored objects (IoU >= 0.5, greedy by
    score), and the objects."""
    from uq_perception.training.detection_metrics import match_detections
    from uq_perception.training.detection_scoring import IOU_THRESHOLD

    matched, ignored = match_detections(boxes, scores, split.boxes[i], IOU_THRESHOLD,
                                        split.hard(i))
    keep = (matched >= 0) & ~ignored
    if known_only:
        keep &= split.labels[i][np.maximum(matched, 0)] >= 0
    return np.flatnonzero(keep), matched[keep]


def _add_matches(rows: _Rows, split: DetectionSplit, i: int, det: np.ndarray,
                 obj: np.ndarray, logits: np.ndarray, phi: np.ndarray,
                 layers: Mapping[str, np.ndarray], scale: np.ndarray) -> None:
    names = np.array([split.category_names[int(c)] for c in split.category_ids[i][obj]],
                     dtype=object)
    rows.add(logits=logits[det], phi=phi[det], labels=split.labels[i][obj], categories=names,
             images=np.full(len(det), i), scale=scale[det],
             **{f'layer:{k}': v[det] for k, v in layers.items()})


def onnx_records(detector: OnnxLayerDetector, split: DetectionSplit, score_threshold: float,
                 max_detections: int, known_only: bool = False, progress: bool = False
                 ) -> Records:
    """The matched detections of ``split`` and their taps, one pass per image."""
    from tqdm import tqdm

    from uq_perception.detectors.layer_taps import anchor_cells, box_pool, patches

    maps = detector.layers.maps()
    first = {layers[0].scale: layers[0] for layers in detector.layers.branches if layers}
    rows = _Rows()
    for i, image in enumerate(tqdm(split.images, desc=f'layers {split.name}', unit='image',
                                   disable=not progress)):
        frame = detector.infer_layers(image, score_threshold, max_detections)
        dets = frame.detections
        det, obj = _matched(split, i, dets.boxes, dets.scores, known_only)
        if det.size == 0:
            continue
        shapes = detector.map_shapes(frame.values)
        scale, cells = anchor_cells(frame.anchors[det], detector.tap.scale_sizes, shapes)
        layers = {label: box_pool(frame.values[tensor][0], frame.boxes_input[det],
                                  detector.input_size) for label, tensor in maps.items()}
        inputs = np.zeros((len(det), next(iter(first.values())).weight[0].size))
        for s in np.unique(scale):
            at = scale == s
            inputs[at] = patches(frame.values[first[int(s)].input_tensor][0], first[int(s)],
                                 cells[at])
        layers['penultimate_input'] = inputs
        every = np.arange(len(det))
        _add_matches(rows, split, i, every, obj, dets.logits[det], dets.embeddings[det],
                     layers, scale)
    return rows.records(split.name)


#: Maps of the shipped CenterNet read by hooks: its modules whose outputs are ``(B, C, h, w)``.
CENTERNET_MAPS = ('stage2', 'stage3', 'stage4', 'smooth3', 'smooth2', 'embedding_trunk')


def centernet_records(model: CenterNetDetector, split: DetectionSplit, score_threshold: float,
                      max_detections: int, known_only: bool = False, progress: bool = False
                      ) -> Records:
    """As :func:`onnx_records` for the shipped CenterNet: its maps by forward hooks, its
    embedding MLP's input and hidden units for each detection (candidate ``d`` of a frame is
    detection ``d``)."""
    import torch
    from tqdm import tqdm

    from uq_perception.detectors.layer_taps import box_pool

    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[..., None]:
        def hook(_module: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            seen[name] = output.detach()
            if name == 'mlp':
                seen['mlp_input'] = inputs[0].detach()
        return hook

    modules = {name: getattr(model, name) for name in CENTERNET_MAPS}
    modules.update(hidden=model.embedding_mlp[1], mlp=model.embedding_mlp)
    handles = [m.register_forward_hook(keep(name)) for name, m in modules.items()]
    rows = _Rows()
    try:
        for i, image in enumerate(tqdm(split.images, desc=f'layers {split.name}',
                                       unit='image', disable=not progress)):
            with torch.no_grad():
                outputs = model(model.preprocess(image))
            dets = model.decode(outputs, score_threshold, max_detections,
                                image_sizes=[image.shape[:2]])[0]
            det, obj = _matched(split, i, dets.boxes, dets.scores, known_only)
            if det.size == 0:
                continue
            box = outputs['boxes'][0, det].numpy().astype(np.float64)
            xyxy = np.column_stack([box[:, :2] - box[:, 2:] / 2, box[:, :2] + box[:, 2:] / 2])
            layers = {name: box_pool(seen[name][0].numpy(), xyxy, model.input_size)
                      for name in CENTERNET_MAPS}
            layers['mlp_input'] = seen['mlp_input'][0, det].numpy().astype(np.float64)
            layers['penultimate_input'] = seen['hidden'][0, det].numpy().astype(np.float64)
            every = np.arange(len(det))
            _add_matches(rows, split, i, every, obj, dets.logits[det], dets.embeddings[det],
                         layers, np.zeros(len(det), np.int64))
    finally:
        for handle in handles:
            handle.remove()
    return rows.records(split.name)


# ------------------------------------------------------------- the penultimate layer


@dataclass(frozen=True)
class Penultimate:
    """The class branch's layer before the last, per scale: ``z = V p + u``, then an
    element-wise activation (a YOLO's SiLU) or the sphere of ``radius`` (the CenterNet's
    embedding), then the class layer ``W_s``.

    Attributes
    ----------
    weights, biases, heads
        Per scale ``V`` ``(width, |p|)``, ``u`` ``(width,)``, ``W_s`` ``(C, width)``.
    activation, slope
        The element-wise activation, or ``'sphere'``.
    radius
        The sphere's radius (``'sphere'`` only).
    """

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    heads: tuple[np.ndarray, ...]
    activation: str
    slope: float = 0.0
    radius: float = 0.0

    def pre_activation(self, inputs: np.ndarray, scale: np.ndarray) -> np.ndarray:
        z = np.empty((len(inputs), self.weights[0].shape[0]))
        for s in np.unique(scale):
            at = scale == s
            z[at] = inputs[at] @ self.weights[s].T + self.biases[s]
        return z

    def output(self, z: np.ndarray) -> np.ndarray:
        """The layer's output (``phi`` of the detection's scale) from its pre-activation."""
        if self.activation == 'sphere':
            return self.radius * z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
        if self.activation == 'silu':
            return z / (1.0 + np.exp(-z))
        if self.activation in ('relu', 'leaky_relu'):
            return np.where(z > 0, z, self.slope * z)
        if self.activation == 'sigmoid':
            return 1.0 / (1.0 + np.exp(-z))
        return z

    def signal(self, z: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """``(N, C, width)`` back-propagated signals ``g_c`` (layer_kernel)."""
        from uq_perception.ntk.layer_kernel import (
            activation_derivative,
            elementwise_signal,
            normalised_signal,
        )

        g = np.empty((len(z), self.heads[0].shape[0], z.shape[1]))
        for s in np.unique(scale):
            at = scale == s
            g[at] = normalised_signal(self.heads[s], z[at], self.radius) \
                if self.activation == 'sphere' else elementwise_signal(
                    self.heads[s], activation_derivative(self.activation, z[at], self.slope))
        return g

    def input_gradient(self, inputs: np.ndarray, scale: np.ndarray, logit_gradient: np.ndarray
                       ) -> np.ndarray:
        """``dL/dp`` of a loss whose gradient with respect to the logits is given."""
        g = self.signal(self.pre_activation(inputs, scale), scale)
        out = np.empty_like(inputs)
        for s in np.unique(scale):
            at = scale == s
            out[at] = np.einsum('nc,ncw->nw', logit_gradient[at], g[at]) @ self.weights[s]
        return out


def onnx_penultimate(detector: OnnxLayerDetector) -> Penultimate:
    first = [layers[0] for layers in detector.layers.branches]
    if not first or len(first) != len(detector.tap.nodes):
        raise ValueError('the class branch of every scale must be a convolution with an '
                         'activation before the class layer')
    return Penultimate(tuple(f.weight.reshape(f.weight.shape[0], -1) for f in first),
                       tuple(f.bias for f in first),
                       tuple(n.head.weight.astype(np.float64) for n in detector.tap.nodes),
                       first[0].activation, first[0].slope)


def centernet_penultimate(model: CenterNetDetector) -> Penultimate:
    if not model.normalize_embedding:
        raise ValueError('the study reads a CenterNet whose embedding is on a sphere')
    last = model.embedding_mlp[2]
    return Penultimate((last.get_parameter('weight').detach().numpy().astype(np.float64),),
                       (last.get_parameter('bias').detach().numpy().astype(np.float64),),
                       (model.head.weight.detach().numpy().astype(np.float64),), 'sphere',
                       radius=math.sqrt(model.embedding_dim))


# --------------------------------------------------------------------------- scores


def _gp(features: np.ndarray, labels: np.ndarray, classes: int, transform: str = 'centre_l2',
        blocks: Sequence[Any] | None = None, seed: int = 0) -> Any:
    """A one-expert GP with zero mean on ``features`` (hyperparameters by the evidence)."""
    from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig
    from uq_perception.ntk.feature_transform import FeatureTransform, single_block

    gp = LastLayerNTKGP(np.zeros((classes, features.shape[1])), np.zeros(classes),
                        NTKGPConfig(num_experts=1, seed=seed))
    if transform != 'none':
        gp.feature_transform = FeatureTransform.fitted(
            features, blocks or single_block(features.shape[1]), centre=transform == 'centre_l2')
    return gp.fit(features, labels)


def quantile_of(reference: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The fraction of ``reference`` (known validation detections) at or below a score."""
    ordered = np.sort(reference)
    return lambda s: np.searchsorted(ordered, s, side='right') / len(ordered)


def gradnorm(logits: np.ndarray, phi: np.ndarray, bias_slot: bool = False) -> np.ndarray:
    """Minus GradNorm: ``-|softmax(f) - 1/C|_1 |[phi; 1]|_1`` (higher: more unknown); with
    ``bias_slot`` the 1 is already in ``phi`` (a YOLO head's block layout)."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return -np.abs(p - 1.0 / logits.shape[1]).sum(axis=1) * (
        np.abs(phi).sum(axis=1) + (0.0 if bias_slot else 1.0))


def knn_distances(fit: np.ndarray, queries: Mapping[str, np.ndarray], width: int,
                  neighbours: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
    """Per ``k`` of ``neighbours`` and per query set, the distance to the ``k``-th nearest
    fit feature after PCA to ``width`` (fitted on ``fit``, centred) and L2 normalisation."""
    mean = fit.mean(axis=0)
    _, _, vt = np.linalg.svd(fit - mean, full_matrices=False)
    basis = vt[:min(width, vt.shape[0])].T

    def unit(x: np.ndarray) -> np.ndarray:
        y = (x - mean) @ basis
        return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)

    bank = unit(fit)
    out: dict[int, dict[str, np.ndarray]] = {k: {} for k in neighbours}
    for name, query in queries.items():
        d2 = np.sort(np.maximum(2.0 - 2.0 * unit(query) @ bank.T, 0.0), axis=1)
        for k in neighbours:
            out[k][name] = np.sqrt(d2[:, min(k, len(bank)) - 1])
    return out


def safe_mlp(clean: np.ndarray, perturbed: np.ndarray, seed: int = 0, epochs: int = 200
             ) -> Callable[[np.ndarray], np.ndarray]:
    """An MLP (one hidden layer of 64, torch) told clean (0) from perturbed (1) features;
    returns its probability of "perturbed"."""
    import torch

    torch.manual_seed(seed)
    mean, std = clean.mean(axis=0), clean.std(axis=0) + 1e-6
    x = torch.tensor(np.vstack([clean, perturbed]) - mean, dtype=torch.float32) / \
        torch.tensor(std, dtype=torch.float32)
    y = torch.tensor(np.r_[np.zeros(len(clean)), np.ones(len(perturbed))], dtype=torch.float32)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 1))
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(x)[:, 0], y)
        loss.backward()
        optimiser.step()

    def score(features: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            q = torch.tensor((features - mean) / std, dtype=torch.float32)
            return torch.sigmoid(net(q)[:, 0]).numpy().astype(np.float64)
    return score


@dataclass
class Candidate:
    """One candidate: its chosen option, each option's selection AUROC, its scores."""

    name: str
    option: str
    selection_auroc: dict[str, float] = field(default_factory=dict)
    scores: dict[str, np.ndarray] = field(default_factory=dict)


def _choose(name: str, options: Mapping[str, Mapping[str, np.ndarray]], selection: str,
            unknown: Mapping[str, np.ndarray]) -> Candidate:
    """The option with the best AUROC on the ``selection`` set (first one on ties)."""
    from uq_perception.training.metrics import auroc

    aurocs = {o: round(auroc(s[selection], unknown[selection]), 4) for o, s in options.items()}
    best = max(aurocs, key=lambda o: aurocs[o])
    return Candidate(name, best, aurocs, dict(options[best]))


def candidate_scores(fit: Records, val: Records, sets: Mapping[str, Records],
                     penultimate: Penultimate, head: tuple[np.ndarray, np.ndarray],
                     activation: str, blocks: Sequence[Any], selection: str,
                     committed: Any = None, sketch_width: int = SKETCH_WIDTH, seed: int = 0,
                     log: Callable[[str], None] = print) -> list[Candidate]:
    """Every candidate's scores on ``val`` and on every set (module docstring); options
    chosen on ``sets[selection]``.

    Parameters
    ----------
    fit, val
        Known detections the candidates are fitted on, and whose quantiles calibrate them.
    sets
        The evaluation sets by name, the selection set among them.
    penultimate, head
        The branch's layer before the last, and ``W``, ``b`` of ``logits = W phi + b``.
    activation
        The detector's class activation (``sigmoid`` or ``softmax``): its class loss for
        the FGSM step.
    blocks
        The feature blocks of ``phi`` (one per scale of a YOLO head).
    committed
        The GP the node ships, or None.
    """
    from uq_perception.ntk.layer_kernel import ProductSketch
    from uq_perception.training.ood_baselines import energy_score, msp_score

    every = {'val': val, **sets}
    unknown = {n: r.unknown for n, r in every.items()}
    known_fit = fit.labels >= 0
    fit = fit.subset(known_fit)
    classes = head[0].shape[0]
    candidates: list[Candidate] = []

    def single(name: str, score: Callable[[Records], np.ndarray]) -> Candidate:
        found = Candidate(name, '-', scores={n: score(r) for n, r in every.items()})
        candidates.append(found)
        return found

    single('energy', lambda r: energy_score(r.logits))
    single('msp', lambda r: msp_score(r.logits, activation))
    bias_slot = any(b.bias_index is not None for b in blocks)
    single('gradnorm', lambda r: gradnorm(r.logits, r.phi, bias_slot))
    if committed is not None:
        single('gp_committed_score',
               lambda r: committed.predict(r.phi, r.logits).calibrated_score)
        single('gp_committed_variance', lambda r: committed.gp_variance(r.phi))

    # The last layer, refitted on the same known objects as every other GP here.
    transform = 'centre_l2' if len(blocks) > 1 or np.ptp(np.linalg.norm(fit.phi, axis=1)) > \
        1e-3 * np.linalg.norm(fit.phi, axis=1).mean() else 'none'
    last = _gp(fit.phi, fit.labels, classes, transform, blocks, seed)
    single('gp_last', lambda r: last.gp_variance(r.phi))
    log(f'last-layer GP refitted ({transform})')

    # The penultimate layer's NTK: one independent sketch per scale, so detections of two
    # scales (separate parameters) have kernel 0 in expectation.
    scales = len(penultimate.weights)
    sketches = [ProductSketch(classes * penultimate.weights[s].shape[0],
                              penultimate.weights[s].shape[1] + 1, sketch_width, seed + s)
                for s in range(scales)]

    def sketched(r: Records) -> np.ndarray:
        inputs = r.layers['penultimate_input']
        g = penultimate.signal(penultimate.pre_activation(inputs, r.scale), r.scale)
        out = np.empty((len(inputs), sketch_width))
        for s in np.unique(r.scale):
            at = r.scale == s
            out[at] = sketches[s].of_jacobian(g[at], inputs[at])
        return out

    ntk = {n: sketched(r) for n, r in {'fit': fit, **every}.items()}
    options = {}
    for kind in ('none', 'centre_l2'):
        gp = _gp(ntk['fit'], fit.labels, classes, kind, seed=seed)
        options[kind] = {n: gp.gp_variance(ntk[n]) for n in every}
    candidates.append(_choose('ntk_penultimate', options, selection, unknown))

    # Both layers: phi and the sketch, each put on its sphere, the sketch weighted by the
    # weight with the highest log evidence (known objects alone).
    def unit(x: np.ndarray, mean: np.ndarray) -> np.ndarray:
        y = x - mean
        return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)

    phi_mean, ntk_mean = fit.phi.mean(axis=0), ntk['fit'].mean(axis=0)
    both = {n: (unit(r.phi, phi_mean), unit(ntk[n], ntk_mean))
            for n, r in {'fit': fit, **every}.items()}
    fits = {w: _gp(np.hstack([both['fit'][0], w * both['fit'][1]]), fit.labels, classes,
                   'none', seed=seed) for w in TWO_LAYER_WEIGHTS}
    w = max(fits, key=lambda v: fits[v].log_marginal_likelihood(0))
    found = Candidate('ntk_last_two', f'weight {w} (log evidence)', scores={
        n: fits[w].gp_variance(np.hstack([both[n][0], w * both[n][1]])) for n in every})
    candidates.append(found)
    log(f'penultimate NTK sketched to {sketch_width}; last two layers at weight {w}')

    # One GP per tapped layer: the maps, box-pooled, and the penultimate layer's input at the
    # anchor.
    layer_names = list(fit.layers)
    per_layer: dict[str, dict[str, np.ndarray]] = {}
    for name in layer_names:
        gp = _gp(fit.layers[name], fit.labels, classes, 'centre_l2', seed=seed)
        per_layer[name] = {n: gp.gp_variance(r.layers[name]) for n, r in every.items()}
        candidates.append(Candidate(f'gp_layer:{name}', '-', scores=per_layer[name]))
    log(f'{len(layer_names)} per-layer GPs fitted')

    # Experts: each GP's quantile among the known validation detections, combined.
    experts = {**per_layer, 'phi': candidates[[c.name for c in candidates].index('gp_last')]
               .scores}
    quantiles = {e: {n: quantile_of(s['val'][~unknown['val']])(s[n]) for n in every}
                 for e, s in experts.items()}
    candidates.append(_choose('gp_experts', {
        rule: {n: reduce(np.stack([quantiles[e][n] for e in experts]), axis=0) for n in every}
        for rule, reduce in (('mean', np.mean), ('max', np.max))}, selection, unknown))

    # Fusion of the energy with a GP, by quantiles among the known validation detections.
    energy = candidates[0].scores
    energy_q = {n: quantile_of(energy['val'][~unknown['val']])(energy[n]) for n in every}
    partners = {c.name: c.scores for c in candidates
                if c.name.startswith(('gp_last', 'ntk_', 'gp_layer:'))}
    fused = {}
    for partner, scores in partners.items():
        q = quantile_of(scores['val'][~unknown['val']])
        for weight in FUSION_WEIGHTS:
            fused[f'{partner}, energy weight {weight}'] = {
                n: weight * energy_q[n] + (1 - weight) * q(scores[n]) for n in every}
    candidates.append(_choose('fusion_energy', fused, selection, unknown))

    # KNN after PCA, on any map (and phi).
    knn = {}
    for name in [*layer_names, 'phi']:
        for width in PCA_WIDTHS:
            by_k = knn_distances(fit.features(name), {n: r.features(name)
                                                      for n, r in every.items()}, width,
                                 KNN_NEIGHBOURS)
            for k, scores in by_k.items():
                knn[f'{name}, PCA {width}, k {k}'] = scores
    candidates.append(_choose('knn_pca', knn, selection, unknown))
    log(f'KNN: {len(knn)} options')

    # SAFE-style: clean known phi_s against phi_s after one FGSM step on the penultimate
    # layer's input, the step a multiple of that input's spread.
    inputs = fit.layers['penultimate_input']
    onehot = np.eye(classes)[fit.labels]
    if activation == 'sigmoid':
        probabilities = 1.0 / (1.0 + np.exp(-fit.logits))
    else:
        z = np.exp(fit.logits - fit.logits.max(axis=1, keepdims=True))
        probabilities = z / z.sum(axis=1, keepdims=True)
    direction = np.sign(penultimate.input_gradient(inputs, fit.scale, probabilities - onehot))
    spread = inputs.std()

    def own_phi(r: Records, moved: np.ndarray | None = None) -> np.ndarray:
        x = r.layers['penultimate_input'] if moved is None else moved
        return penultimate.output(penultimate.pre_activation(x, r.scale))

    clean = own_phi(fit)
    # The layer recomputed from its input must be the detector's own phi: the check that
    # the penultimate layer read is the one the class layer reads.
    deviation = max(float(np.abs(clean[fit.scale == s] - fit.phi[fit.scale == s][
        :, blocks[s].start:blocks[s].stop]).max(initial=0.0)) for s in np.unique(fit.scale))
    log(f'penultimate layer recomputed: largest deviation from phi {deviation:.2e}')
    if deviation > 1e-3 * max(1.0, float(np.abs(fit.phi).max())):
        raise ValueError(f'the penultimate layer read does not give phi (deviation '
                         f'{deviation:.3g})')
    safe = {}
    for step in FGSM_STEPS:
        mlp = safe_mlp(clean, own_phi(fit, inputs + step * spread * direction), seed)
        safe[f'FGSM step {step} x input spread'] = {n: mlp(own_phi(r)) for n, r in every.items()}
    candidates.append(_choose('safe_mlp', safe, selection, unknown))
    log('SAFE-style MLPs trained')

    for c in candidates:
        if not c.selection_auroc:
            c.selection_auroc = _choose(c.name, {c.option: c.scores}, selection,
                                        unknown).selection_auroc
    return candidates


# ------------------------------------------------------------------------ bootstrap


def _weighted_auroc(scores: np.ndarray, unknown: np.ndarray, weights: np.ndarray
                    ) -> np.ndarray:
    """AUROC (ties one half) of every row of ``weights`` ``(B, N)``: detection ``j``
    counted ``weights[b, j]`` times."""
    values, group = np.unique(scores, return_inverse=True)
    groups = len(values)
    w_neg = np.zeros((len(weights), groups))
    np.add.at(w_neg.T, group[~unknown], weights[:, ~unknown].T)
    below = np.cumsum(w_neg, axis=1) - w_neg
    pos = weights[:, unknown]
    wins = (pos * (below[:, group[unknown]] + 0.5 * w_neg[:, group[unknown]])).sum(axis=1)
    total = pos.sum(axis=1) * weights[:, ~unknown].sum(axis=1)
    return np.where(total > 0, wins / np.where(total > 0, total, 1.0), np.nan)


def _weighted_fpr95(scores: np.ndarray, unknown: np.ndarray, weights: np.ndarray
                    ) -> np.ndarray:
    known = scores[~unknown]
    order = np.argsort(known, kind='stable')
    cumulative = np.cumsum(weights[:, ~unknown][:, order], axis=1)
    total = cumulative[:, -1:]
    at = (cumulative < 0.95 * total).sum(axis=1)
    threshold = known[order][np.minimum(at, len(known) - 1)]
    passed = (scores[unknown][None, :] <= threshold[:, None]) * weights[:, unknown]
    return passed.sum(axis=1) / np.maximum(weights[:, unknown].sum(axis=1), 1e-12)


def intervals(candidates: Sequence[Candidate], records: Records, name: str,
              references: Sequence[str] = ('energy',), draws: int = BOOTSTRAP, seed: int = 0
              ) -> dict[str, dict[str, Any]]:
    """Per candidate on one set: AUROC and FPR95 with their 95 % intervals, and the AUROC
    difference to each of ``references`` with its interval (``auroc_minus_<reference>``);
    images resampled with replacement."""
    from uq_perception.training.metrics import auroc
    from uq_perception.training.ood_baselines import fpr_at_95_tpr

    unknown = records.unknown
    _, image = np.unique(records.images, return_inverse=True)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(image.max() + 1, np.full(image.max() + 1, 1.0 / (image.max() + 1)),
                             size=draws)
    weights = counts[:, image].astype(np.float64)
    by_name = {c.name: c for c in candidates}
    bases = {r: (auroc(by_name[r].scores[name], unknown),
                 _weighted_auroc(by_name[r].scores[name], unknown, weights)) for r in references}

    def ci(x: np.ndarray) -> list[float]:
        return [round(float(v), 4) for v in np.nanpercentile(x, [2.5, 97.5])]

    out = {}
    for c in candidates:
        s = c.scores[name]
        a = _weighted_auroc(s, unknown, weights)
        point = auroc(s, unknown)
        out[c.name] = {
            'auroc': round(point, 4), 'auroc_ci': ci(a),
            'fpr95': round(fpr_at_95_tpr(s[~unknown], s[unknown]), 4),
            'fpr95_ci': ci(_weighted_fpr95(s, unknown, weights))}
        for r, (base, base_draws) in bases.items():
            out[c.name][f'auroc_minus_{r}'] = round(point - base, 4)
            out[c.name][f'auroc_minus_{r}_ci'] = ci(a - base_draws)
    return out


# ---------------------------------------------------------------------------- study


def split_by_class(records: Records, selection: Sequence[str], judging: Sequence[str]
                   ) -> tuple[Records, Records]:
    """The detections of the images whose matched unknown objects are all of ``selection``
    classes, and of those whose are all of ``judging`` classes (each with its known
    objects); images with both, or with unknowns of neither, are in neither."""
    chosen, judged = set(selection), set(judging)
    pick: dict[str, list[int]] = {'selection': [], 'judging': []}
    for image in np.unique(records.images):
        at = records.images == image
        kinds = set(records.categories[at & records.unknown])
        if kinds and kinds <= chosen:
            pick['selection'].append(image)
        elif kinds and kinds <= judged:
            pick['judging'].append(image)
    return tuple(records.subset(np.isin(records.images, pick[k]), k)  # type: ignore[return-value]
                 for k in ('selection', 'judging'))


def _open(args: argparse.Namespace) -> tuple[Any, str, Callable[..., Records], Penultimate,
                                             tuple[np.ndarray, np.ndarray], str, Any, dict]:
    """The detector, how its records are read, its penultimate layer and head."""
    from uq_eval.gp.fit_command import _ADAPTER_OPTIONS
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.ntk.feature_transform import FeatureBlock
    from uq_perception.runtime.onnx_adapter import OnnxAdapterConfig
    from uq_perception.runtime.onnx_layers import OnnxLayerDetector

    if args.model.suffix.lower() == '.onnx':
        settings = {f: getattr(args, o) for o, (f, _) in _ADAPTER_OPTIONS.items()
                    if getattr(args, o) is not None}
        for name in ('class_nodes', 'class_names', 'mean', 'std', 'input_size'):
            if name in settings:
                settings[name] = tuple(settings[name])
        detector = OnnxLayerDetector(args.model, OnnxAdapterConfig(**settings),
                                     tuple(args.onnx_feature_nodes), provider=args.provider,
                                     threads=args.threads)
        head = detector.head()
        blocks = tuple(FeatureBlock(*b) for b in detector.feature_blocks())
        return (detector, detector.model_id,
                lambda split, *a, **k: onnx_records(detector, split, *a, **k),
                onnx_penultimate(detector), (head.weight.astype(np.float64), head.bias),
                detector.class_activation, blocks, {'taps': detector.layers.describe(),
                                                    'adapter': detector.describe()})
    if args.onnx_feature_nodes:
        raise ValueError('--onnx-feature-nodes names tensors of an ONNX model')
    import torch

    torch.set_num_threads(args.threads)
    model = load_detector(args.model)
    model.eval()
    return (model, model.model_id,
            lambda split, *a, **k: centernet_records(model, split, *a, **k),
            centernet_penultimate(model),
            (model.head.weight.detach().numpy().astype(np.float64),
             model.head.bias.detach().numpy().astype(np.float64)), 'softmax',
            (FeatureBlock(0, model.embedding_dim),),
            {'taps': {'maps': {n: f'module {n}' for n in CENTERNET_MAPS},
                      'anchor': ['embedding MLP input', 'hidden units (penultimate input)']}})


def study(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Read the splits once, score every candidate, bootstrap (module docstring)."""
    from uq_eval.detector.evaluation import read_split
    from uq_eval.detector.procedural_unknowns import (
        check_procedural_classes,
        render_procedural_split,
    )
    from uq_eval.gp.fitting import check_selection_judging
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detection_scoring import (
        AP_MAX_DETECTIONS,
        AP_SCORE_THRESHOLD,
        OPERATING_MAX_DETECTIONS,
        OPERATING_THRESHOLD,
    )

    check_selection_judging(args.selection_classes, args.judging_classes)
    started = time.perf_counter()
    detector, model_id, read, penultimate, head, activation, blocks, taps = _open(args)
    names = list(detector.class_names)
    size = tuple(detector.input_size)
    progress = not args.no_progress

    def split_of(directory: Path) -> DetectionSplit:
        split = read_split(directory, names, size)
        if args.max_images and len(split) > args.max_images:
            split = replace(split, images=split.images[:args.max_images],
                            image_ids=split.image_ids[:args.max_images],
                            **{k: getattr(split, k)[:args.max_images] for k in (
                                'boxes', 'labels', 'category_ids', 'occluded', 'truncated',
                                'auxiliary')})
        return split

    fit = read(split_of(args.fit_data / 'train'), AP_SCORE_THRESHOLD, AP_MAX_DETECTIONS,
               known_only=True, progress=progress)
    val = read(split_of(args.data / 'val'), OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
               known_only=True, progress=progress)
    unknown = read(split_of(args.data / 'test_unknown'), OPERATING_THRESHOLD,
                   OPERATING_MAX_DETECTIONS, progress=progress)
    selection, judging = split_by_class(unknown, args.selection_classes, args.judging_classes)
    sets = {'selection': selection, 'judging': judging}
    for name, records in sets.items():
        if records.unknown.all() or not records.unknown.any():
            raise ValueError(f'the {name} images hold {int(records.unknown.sum())} unknown and '
                             f'{int((~records.unknown).sum())} known detections; both are '
                             'needed (more images, or other classes)')
    if args.procedural_unknowns:
        check_procedural_classes(names)
        split = render_procedural_split(args.procedural_unknowns, args.procedural_seed, size,
                                        names, progress=progress)
        sets['procedural'] = replace(read(split, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
                                          progress=progress), name='procedural')
    counts = {n: {'known': int((~r.unknown).sum()), 'unknown': int(r.unknown.sum()),
                  'images': int(len(np.unique(r.images)))} for n, r in
              {'fit': fit, 'val': val, **sets}.items()}
    for n, c in counts.items():
        log(f'{n}: {c["known"]} known, {c["unknown"]} unknown detections in {c["images"]} images')
    read_seconds = time.perf_counter() - started
    committed = None
    if args.gp is not None:
        committed = LastLayerNTKGP.load(args.gp, feature_dim=fit.phi.shape[1],
                                        class_names=names, model_id=model_id)
    candidates = candidate_scores(fit, val, sets, penultimate, head, activation, blocks,
                                  'selection', committed, args.sketch_width, args.seed, log)
    # The one candidate put forward: the best on the selection images, energy aside.
    forward = max((c for c in candidates if c.name != 'energy'),
                  key=lambda c: c.selection_auroc[c.option])
    # Differences to the energy, and to the score the node publishes today.
    references = ('energy', 'gp_committed_score') if committed is not None else ('energy',)
    results = {n: intervals(candidates, sets[n], n, references, args.bootstrap, args.seed)
               for n in sets}
    return {
        'model': str(args.model), 'model_id': model_id, 'taps': taps,
        'data': {'fit': str(args.fit_data / 'train'), 'evaluation': str(args.data),
                 'procedural_unknowns': args.procedural_unknowns,
                 'procedural_seed': args.procedural_seed, 'max_images': args.max_images},
        'selection_classes': list(args.selection_classes),
        'judging_classes': list(args.judging_classes),
        'counts': counts,
        'candidates': [{'name': c.name, 'option': c.option,
                        'selection_auroc_by_option': c.selection_auroc} for c in candidates],
        'put_forward': {'name': forward.name, 'option': forward.option,
                        'rule': 'best AUROC on the selection images, energy aside'},
        'results': results,
        'seconds': {'read': round(read_seconds, 1),
                    'total': round(time.perf_counter() - started, 1)},
    }


def markdown_table(report: Mapping[str, Any]) -> str:
    """Per candidate: the option chosen, AUROC on the selection images, and on every other
    set AUROC [interval] / FPR95 [interval] and the AUROC difference [interval] to each
    reference (the energy; the published score when there is one)."""
    sets = [n for n in report['results'] if n != 'selection']
    first = next(iter(report['results'][sets[0]].values()))
    references = [k[len('auroc_minus_'):] for k in first
                  if k.startswith('auroc_minus_') and not k.endswith('_ci')]
    head = ['candidate', 'option (chosen on selection)', 'selection AUROC']
    for n in sets:
        head += [f'{n}: AUROC / FPR95'] + [f'{n}: minus {r}' for r in references]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for c in report['candidates']:
        cells = [c['name'], c['option'],
                 f'{report["results"]["selection"][c["name"]]["auroc"]:.3f}']
        for n in sets:
            r = report['results'][n][c['name']]
            cells.append(f'{r["auroc"]:.3f} [{r["auroc_ci"][0]:.3f}, {r["auroc_ci"][1]:.3f}] / '
                         f'{r["fpr95"]:.3f} [{r["fpr95_ci"][0]:.3f}, {r["fpr95_ci"][1]:.3f}]')
            for ref in references:
                low, high = r[f'auroc_minus_{ref}_ci']
                cells.append(f'{r[f"auroc_minus_{ref}"]:+.3f} [{low:+.3f}, {high:+.3f}]')
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Candidates from the layers before the last, against the energy (prints JSON)."""
    from uq_eval.detector.procedural_unknowns import (
        procedural_count_argument,
        procedural_seed_argument,
    )
    from uq_eval.gp.fit_command import add_detector_arguments

    add_detector_arguments(parser, default_model=Path('models/detector.pt'))
    parser.add_argument('--gp', type=Path, default=None,
                        help='the GP the node ships for this model (its published score is '
                             'one candidate)')
    parser.add_argument('--onnx-feature-nodes', nargs='+', default=[], metavar='NAME',
                        help='ONNX nodes or tensors read besides the class branch and the '
                             'neck (e.g. backbone stages)')
    parser.add_argument('--fit-data', type=Path, required=True,
                        help='dataset directory whose train/ known objects fit every candidate')
    parser.add_argument('--data', type=Path, required=True,
                        help='dataset directory with val/ (known quantiles) and test_unknown/')
    parser.add_argument('--selection-classes', nargs='+', default=list(SELECTION_CLASSES),
                        metavar='CLASS', help='unknown classes every option is chosen on')
    parser.add_argument('--judging-classes', nargs='+', default=list(JUDGING_CLASSES),
                        metavar='CLASS', help='unknown classes the choice is judged on')
    parser.add_argument('--procedural-unknowns', type=procedural_count_argument, default=None,
                        metavar='N', help='procedural unknown objects, judged too')
    parser.add_argument('--procedural-seed', type=procedural_seed_argument, default=0)
    parser.add_argument('--max-images', type=positive_int, default=None,
                        help='first images of each split only (quick runs)')
    parser.add_argument('--sketch-width', type=positive_int, default=SKETCH_WIDTH,
                        help='width of the penultimate layer\'s Jacobian sketch')
    parser.add_argument('--bootstrap', type=positive_int, default=BOOTSTRAP,
                        help='bootstrap draws of the intervals')
    parser.add_argument('--seed', type=non_negative_int, default=0)
    parser.add_argument('--out', type=Path, default=None, help='also write the JSON here')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from uq_eval.detector.scoring import print_json_report
    from uq_eval.gp.fit_command import _one_line
    from uq_perception.runtime.onnx_runtime import OnnxRuntimeUnavailableError

    try:
        for path in (args.fit_data / 'train', args.data / 'val', args.data / 'test_unknown'):
            if not path.is_dir():
                raise ValueError(f'{path} is missing (make it with `uq sim dataset`)')
        report = study(args, log=lambda line: print(line, file=sys.stderr, flush=True))
    except (ValueError, OSError, OnnxRuntimeUnavailableError) as exc:
        print(f'uq eval layers: {_one_line(exc)}', file=sys.stderr)
        return 2
    print(markdown_table(report), file=sys.stderr)
    print(f'put forward on the selection images: {report["put_forward"]["name"]} '
          f'({report["put_forward"]["option"]})', file=sys.stderr)
    print_json_report(report, args.out)
    return 0
