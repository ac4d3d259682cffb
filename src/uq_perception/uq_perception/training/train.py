"""Training of the CenterNet detector and fitting of its NTK-GP (ROS-free).

:func:`run_training` (behind ``uq train --data DIR --out models/``) trains the detector on
``DIR/train`` (CPU, fixed seed), or on the training part of a COCO instances file
(:class:`~uq_perception.training.detector_data.CocoTrainingData`, ``uq train --coco FILE``), checks
it on the validation split, extracts the embeddings of the
known objects of ``DIR/train`` (from the detections that find them, as at inference), fits
the last-layer NTK-GP on the classification head, chooses the gating (number of experts)
on held-out validation NLL, calibrates the probit factor, temperature and OOD threshold on
``DIR/val``, and writes ``detector.pt`` and ``detector_gp.npz`` with a shared model id.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_perception.detectors.model_files import DETECTOR_FILE, GP_FILE

if TYPE_CHECKING:
    import torch

    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.detectors.contract import LinearHead
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.ntk.feature_transform import FeatureBlock, FeatureTransform
    from uq_perception.training.detector_data import CocoTrainingData, DetectionSplit, Targets

# Validation NLLs closer than this count as equal; the gating with fewer experts wins.
NLL_TIE = 1e-3


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of detector training.

    Attributes
    ----------
    epochs : int
        Passes over the training split.
    batch_size : int
        Images per step.
    learning_rate : float
        Peak AdamW learning rate (linear warm-up, then cosine decay to 2 % of it).
    weight_decay : float
        AdamW weight decay.
    warmup_steps : int
        Steps of linear warm-up.
    embedding_dim : int
        Dimension ``D`` of the per-detection embedding.
    class_weight, size_weight, offset_weight : float
        Weights of the cross-entropy, log-size L1 and offset L1 losses (the focal
        heatmap loss has weight 1).
    outlier_weight : float
        Weight of outlier exposure on auxiliary objects: cross-entropy of their logits to
        the uniform distribution over the known classes.
    separation_weight : float
        Weight of the mean squared cosine between the embeddings of auxiliary and known
        objects of a batch. The last-layer GP's variance is high only in embedding
        directions that the known training objects leave empty, so "other objects" are
        taught to point there; unknown objects that resemble them follow.
    compactness_weight : float
        Weight of the mean cosine distance between each known object's embedding and its
        class's row of the linear head. Known embeddings gathered near a few directions
        leave the rest of the sphere to the GP's high-variance region (0: off). On the
        format-3 data, 0.5 raised the GP-variance AUROC of unknown objects from 0.944 to
        0.955 (detection AP 0.936 -> 0.916); 2.0 lowered it to 0.930 (models/MODEL_CARD.md).
    input_size : tuple[int, int]
        ``(height, width)`` of the network input (multiples of 16); images of another size
        are resized to it.
    crop : tuple[int, int] | None
        ``(height, width)`` of random training crops (multiples of 16, at most
        ``input_size``; None: whole images). Crops make a step cheaper; objects keep their
        scale.
    box_jitter : bool
        Read the training embeddings inside randomly perturbed ground-truth boxes (see
        :func:`uq_perception.training.detector_data.jitter_boxes`).
    seed : int
        Seed of initialisation, shuffling and augmentation.
    threads : int
        torch CPU threads. One by default: on a machine shared with other jobs, a second
        thread that is descheduled stalls every parallel op, which made steps ten times
        slower here; one thread also leaves a core to the rest of the system.
    """

    epochs: int = 40
    batch_size: int = 16
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 200
    embedding_dim: int = 64
    class_weight: float = 1.0
    size_weight: float = 1.0
    offset_weight: float = 1.0
    outlier_weight: float = 0.5
    separation_weight: float = 1.0
    compactness_weight: float = 0.5
    input_size: tuple[int, int] = (240, 320)
    crop: tuple[int, int] | None = (160, 224)
    box_jitter: bool = True
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ('epochs', 'batch_size', 'embedding_dim', 'threads'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        for name in ('learning_rate', 'class_weight', 'size_weight', 'offset_weight'):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        for name in ('weight_decay', 'warmup_steps', 'outlier_weight', 'separation_weight',
                     'compactness_weight'):
            if not getattr(self, name) >= 0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')
        if len(self.input_size) != 2 or any(s < 16 or s % 16 for s in self.input_size):
            raise ValueError(f'input_size must be (height, width), multiples of 16, got '
                             f'{self.input_size}')
        if self.crop is not None and (len(self.crop) != 2 or any(
                c < 16 or c % 16 for c in self.crop)):
            raise ValueError(f'crop must be (height, width), multiples of 16, got {self.crop}')
        if self.crop is not None and any(c > s for c, s in zip(self.crop, self.input_size,
                                                               strict=True)):
            raise ValueError(f'crop {self.crop} is larger than input_size {self.input_size}')


def _log(message: str) -> None:
    # Flushed at once: training runs for long in the background with output in a file.
    print(message, flush=True)


def focal_loss(heatmap_logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss, normalised by the number of centres.

    Cells where ``target == 1`` are centres; elsewhere the Gaussian target lowers the
    penalty for firing near a centre by ``(1 - target)^4``.
    """
    import torch
    import torch.nn.functional as F

    pos = target.eq(1.0).float()
    prob = torch.sigmoid(heatmap_logits)
    # log-sigmoid is stable where log(sigmoid) would underflow.
    log_p = F.logsigmoid(heatmap_logits)
    log_not_p = F.logsigmoid(-heatmap_logits)
    pos_loss = -((1 - prob) ** 2) * log_p * pos
    neg_loss = -((1 - target) ** 4) * prob ** 2 * log_not_p * (1 - pos)
    return (pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1.0)


def detection_loss(model: CenterNetDetector, maps: dict[str, torch.Tensor], targets: Targets,
                   config: TrainConfig) -> dict[str, torch.Tensor]:
    """Weighted loss terms of a batch.

    Keys: ``total``, ``heatmap``, ``size``, ``offset``, ``class`` (cross-entropy on known
    objects), ``outlier`` (cross-entropy to uniform on auxiliary objects),
    ``separation`` (squared cosine between auxiliary and known embeddings) and
    ``compactness`` (cosine distance of known embeddings to their class's head row).
    """
    import torch
    import torch.nn.functional as F

    from uq_perception.detectors.centernet import gather_cells
    from uq_perception.training.detector_data import OUTLIER_LABEL

    heat = focal_loss(maps['heatmap_logits'], targets.heatmap)
    mask = targets.mask.unsqueeze(2)
    count = targets.mask.sum().clamp(min=1.0)
    size = (torch.abs(gather_cells(maps['size'], targets.index) - targets.size) * mask).sum()
    offset = (torch.abs(gather_cells(maps['offset'], targets.index) - targets.offset)
              * mask).sum()
    size, offset = size / count, offset / count
    taught = targets.label >= 0
    outlier = targets.label == OUTLIER_LABEL
    cls = outlier_loss = separation = compactness = heat.new_zeros(())
    if bool(taught.any()) or bool(outlier.any()):
        phi = model.embed_cells(maps, targets.index, targets.boxes)
        logits = model.head(phi)
        if bool(taught.any()):
            cls = F.cross_entropy(logits[taught], targets.label[taught])
            class_rows = model.head.weight[targets.label[taught]]
            compactness = (1.0 - F.cosine_similarity(phi[taught], class_rows, dim=-1)).mean()
        if bool(outlier.any()):
            outlier_loss = -F.log_softmax(logits[outlier], dim=-1).mean()
            if bool(taught.any()):
                cosine = F.normalize(phi[outlier], dim=-1) @ F.normalize(phi[taught], dim=-1).T
                separation = cosine.pow(2).mean()
    total = heat + config.size_weight * size + config.offset_weight * offset \
        + config.class_weight * cls + config.outlier_weight * outlier_loss \
        + config.separation_weight * separation + config.compactness_weight * compactness
    return {'total': total, 'heatmap': heat, 'size': size, 'offset': offset, 'class': cls,
            'outlier': outlier_loss, 'separation': separation, 'compactness': compactness}


def _batches(count: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    order = rng.permutation(count)
    for start in range(0, count, batch_size):
        yield order[start:start + batch_size]


def train_detector(train: DetectionSplit, config: TrainConfig, progress: bool = True,
                   log: Any = _log) -> tuple[CenterNetDetector, list[dict[str, float]]]:
    """Train a detector on a split.

    Parameters
    ----------
    train : DetectionSplit
        Training images at the model input size.
    config : TrainConfig
        Hyperparameters.
    progress : bool
        Show a progress bar.
    log : callable
        Receives one summary line per epoch.

    Returns
    -------
    tuple[CenterNetDetector, list[dict[str, float]]]
        The trained model (eval mode) and per-epoch mean losses.
    """
    import torch
    from tqdm import tqdm

    from uq_perception.detectors.centernet import STRIDE, CenterNetDetector
    from uq_perception.training.detector_data import augment, build_targets, jitter_boxes

    if len(train) == 0:
        raise ValueError('the training split has no images')
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    height, width = train.images.shape[1:3]
    model = CenterNetDetector(train.class_names, embedding_dim=config.embedding_dim,
                              input_size=(height, width))
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs

    def schedule(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        t = (step - config.warmup_steps) / max(total_steps - config.warmup_steps, 1)
        return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, schedule)
    history: list[dict[str, float]] = []
    bar = tqdm(total=total_steps, desc='training', unit='step', disable=not progress)
    model.train()
    try:
        for epoch in range(config.epochs):
            sums: dict[str, float] = {}
            steps = 0
            for batch in _batches(len(train), config.batch_size, rng):
                images, boxes, labels = augment(
                    train.images[batch], [train.boxes[i] for i in batch],
                    [train.class_targets(i) for i in batch], rng, crop=config.crop)
                targets = build_targets(boxes, labels, (images.shape[2] // STRIDE,
                                                        images.shape[3] // STRIDE))
                if config.box_jitter:
                    targets = replace(targets, boxes=jitter_boxes(targets.boxes, rng))
                losses = detection_loss(model, model.feature_maps(images), targets, config)
                optimiser.zero_grad(set_to_none=True)
                losses['total'].backward()
                optimiser.step()
                scheduler.step()
                values = {key: float(value.detach()) for key, value in losses.items()}
                for key, value in values.items():
                    sums[key] = sums.get(key, 0.0) + value
                steps += 1
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f'{values["total"]:.3f}')
            record = {key: value / steps for key, value in sums.items()}
            record['epoch'] = epoch + 1
            history.append(record)
            log(f'epoch {epoch + 1}/{config.epochs}: ' + ', '.join(
                f'{k} {v:.4f}' for k, v in record.items() if k != 'epoch'))
    finally:
        bar.close()
    return model.eval(), history


# Activations of the embedding MLP that :func:`object_features` can return next to ``phi``:
# its input (the box's sampled embedding map and the context cell) and its hidden units.
EMBEDDING_LAYERS = ('mlp_input', 'hidden')


@contextmanager
def recorded_embedding_layers(model: CenterNetDetector,
                              enabled: bool = True) -> Iterator[list[dict[str, np.ndarray]]]:
    """Record :data:`EMBEDDING_LAYERS` of every ``embed_cells`` call inside the block.

    Yields a list that gains one ``{layer: (B, K, width) array}`` per call, in call order.
    Forward hooks read the activations, so the code path measured is the detector's own.
    With ``enabled=False`` nothing is hooked and the list stays empty.
    """
    calls: list[dict[str, np.ndarray]] = []
    if not enabled:
        yield calls
        return
    hidden: list[np.ndarray] = []

    def on_hidden(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        hidden.append(output.detach().cpu().numpy())

    def on_mlp(_module: Any, inputs: tuple[torch.Tensor, ...], _output: Any) -> None:
        calls.append({'mlp_input': inputs[0].detach().cpu().numpy(), 'hidden': hidden.pop()})

    handles = [model.embedding_mlp[1].register_forward_hook(on_hidden),
               model.embedding_mlp.register_forward_hook(on_mlp)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def object_features(model: CenterNetDetector, split: DetectionSplit,
                    use_detections: bool = True, batch_size: int = 32,
                    progress: bool = False, with_layers: bool = False
                    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Features of every classifiable known object of a split, with its class.

    With ``use_detections`` the detector runs as at inference (predicted boxes, score
    threshold 0.05) and an object found by a detection at IoU >= 0.5 contributes that
    detection's features: the ones the GP is queried with later, box errors included.
    Objects that no detection finds (and all objects without ``use_detections``)
    contribute the features read inside their ground-truth box.

    Returns
    -------
    tuple[dict[str, np.ndarray], np.ndarray]
        ``{'phi': (N, D) embeddings}``, plus ``(N, width)`` arrays of
        :data:`EMBEDDING_LAYERS` with ``with_layers``; and ``(N,)`` int64 class labels,
        objects in split order.
    """
    import torch
    from tqdm import tqdm

    from uq_perception.training.detection_metrics import match_detections
    from uq_perception.training.detection_scoring import (
        AP_MAX_DETECTIONS,
        AP_SCORE_THRESHOLD,
        IOU_THRESHOLD,
    )
    from uq_perception.training.detector_data import build_targets, images_to_tensor

    names = ('phi',) + (EMBEDDING_LAYERS if with_layers else ())
    features: dict[str, list[np.ndarray]] = {name: [] for name in names}
    labels = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in tqdm(range(0, len(split), batch_size),
                              desc=f'embeddings {split.name}', unit='batch',
                              disable=not progress):
                idx = list(range(start, min(start + batch_size, len(split))))
                targets = build_targets([split.boxes[i] for i in idx],
                                        [split.class_targets(i) for i in idx],
                                        model.output_size)
                maps = model.feature_maps(images_to_tensor(split.images[idx]))
                with recorded_embedding_layers(model, with_layers) as calls:
                    truth = {'phi': model.embed_cells(maps, targets.index,
                                                      targets.boxes).numpy()}
                    candidates = model.candidates(maps) if use_detections else None
                if with_layers:
                    truth.update(calls[0])
                # decode keeps the candidates' order, so detection d is candidate d.
                found_layers = {'phi': candidates['embeddings'].numpy(),
                                **(calls[1] if with_layers else {})} \
                    if candidates is not None else {}
                dets = model.decode(candidates, AP_SCORE_THRESHOLD, AP_MAX_DETECTIONS) \
                    if candidates is not None else None
                for row, i in enumerate(idx):
                    wanted = np.flatnonzero(targets.label[row].numpy() >= 0)
                    values = {name: truth[name][row, wanted] for name in names}
                    if dets is not None and len(dets[row]):
                        matched, _ = match_detections(dets[row].boxes, dets[row].scores,
                                                      split.boxes[i], IOU_THRESHOLD)
                        found = {int(obj): det for det, obj in enumerate(matched) if obj >= 0}
                        for j, obj in enumerate(wanted):
                            if int(obj) in found:
                                for name in names:
                                    values[name][j] = found_layers[name][row, found[int(obj)]]
                    for name in names:
                        features[name].append(values[name])
                    labels.append(split.labels[i][wanted])
    finally:
        model.train(was_training)
    widths = {'phi': model.embedding_dim}
    return ({name: np.concatenate(parts).astype(np.float32) if parts
             else np.zeros((0, widths.get(name, 0)), dtype=np.float32)
             for name, parts in features.items()},
            np.concatenate(labels).astype(np.int64) if labels else np.zeros(0, dtype=np.int64))


def object_embeddings(model: CenterNetDetector, split: DetectionSplit,
                      use_detections: bool = True, batch_size: int = 32,
                      progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(N, D)`` embeddings ``phi`` and ``(N,)`` labels of :func:`object_features`."""
    features, labels = object_features(model, split, use_detections, batch_size, progress)
    return features['phi'], labels


@dataclass(frozen=True)
class GPCandidate:
    """One gating choice of the NTK-GP and its held-out validation NLL."""

    gating: str
    num_experts: int
    validation_nll: float


#: Least spread of the validation GP variances, relative to the largest, of a usable fit.
MIN_RELATIVE_SPREAD = 1e-6


def fit_gp(head: LinearHead, class_names: Sequence[str], model_id: str,
           train_features: np.ndarray, train_labels: np.ndarray, val_features: np.ndarray,
           val_labels: np.ndarray,
           candidates: tuple[tuple[str, int], ...] = (('kmeans', 1), ('kmeans', 4),
                                                      ('class', 0)),
           seed: int = 0, log: Any = _log, reference_split: str = 'val',
           feature_transform: FeatureTransform | None = None,
           scale_blocks: Sequence[FeatureBlock] = ()
           ) -> tuple[LastLayerNTKGP, list[GPCandidate]]:
    """Fit the last-layer NTK-GP and choose its gating on validation data.

    Every candidate gating is fitted on the training embeddings, its probit factor and
    temperature are calibrated on one half of the validation embeddings, and it is scored
    by the NLL on the other half. The winner (fewest experts among those within
    :data:`NLL_TIE` nats of the lowest NLL) is recalibrated on all validation embeddings,
    including its OOD threshold and the reference of its calibrated score.

    The same fit serves any detector of the detector contract (``uq gp fit``): it sees only
    the linear head, the class names and the features.

    Parameters
    ----------
    head : LinearHead
        The classification head ``logits = W phi + b`` the features feed.
    class_names : Sequence[str]
        Its classes, in logit order.
    model_id : str
        Identity of the network; the GP state records it.
    train_features, train_labels, val_features, val_labels : np.ndarray
        ``(N, D)`` features and ``(N,)`` class indices of known objects.
    candidates : tuple[tuple[str, int], ...]
        ``(gating, num_experts)`` pairs; class and scale gating use one expert per class
        or scale (pass 0).
    reference_split : str
        Name of the validation data, recorded as the score reference's provenance.
    feature_transform : FeatureTransform, optional
        The kernel's feature transform (fitted on ``train_features``), stored in the GP.
    scale_blocks : Sequence[FeatureBlock]
        The scales of a multi-scale head, for scale gating (each scale its own noise,
        prior precision, OOD threshold and score reference:
        :mod:`uq_perception.ntk.scale_gating`).

    Raises
    ------
    ValueError
        With too few validation objects.
    """
    from uq_perception.ntk import Gating, LastLayerNTKGP, NTKGPConfig
    from uq_perception.ntk.scale_gating import ScaleGating
    from uq_perception.training.metrics import nll

    if len(val_labels) < 4:
        raise ValueError('need at least 4 validation objects to choose the GP gating')
    weight = np.asarray(head.weight, np.float64)
    bias = np.asarray(head.bias, np.float64)
    names = list(class_names)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(val_labels))
    half_a, half_b = order[: len(order) // 2], order[len(order) // 2:]

    def build(gating: str, experts: int) -> LastLayerNTKGP:
        mode = Gating(gating)
        count = {Gating.CLASS: len(names), Gating.SCALE: len(scale_blocks)}.get(mode, experts)
        # Scales differ in their feature statistics, so each has its own noise too.
        config = NTKGPConfig(num_experts=count, gating=mode, seed=seed,
                             shared_noise=mode is not Gating.SCALE)
        gp = LastLayerNTKGP(weight, bias, config=config, class_names=names,
                            model_id=model_id)
        gp.feature_transform = feature_transform
        if mode is Gating.SCALE:
            gp.scale_gating = ScaleGating(tuple(scale_blocks))
        return gp.fit(train_features, train_labels)

    if not candidates:
        raise ValueError('need at least one GP gating candidate')
    # k-means needs a training object per expert; fewer objects leave such a gating out.
    usable = [(g, e) for g, e in candidates
              if Gating(g) in (Gating.CLASS, Gating.SCALE) or e <= len(train_labels)]
    if not usable:
        raise ValueError(f'{len(train_labels)} training objects are too few for any GP gating '
                         f'of {list(candidates)}')
    for gating, experts in sorted(set(candidates) - set(usable)):
        log(f'NTK-GP {gating} x{experts} left out: only {len(train_labels)} training objects')
    scored: list[GPCandidate] = []
    for gating, experts in usable:
        gp = build(gating, experts)
        gp.calibrate_probabilities(val_features[half_a], val_labels[half_a])
        score = nll(gp.predict(val_features[half_b]).probabilities, val_labels[half_b])
        scored.append(GPCandidate(gating, gp.num_experts, score))
        log(f'NTK-GP {gating} x{gp.num_experts}: held-out validation NLL {score:.4f}')
    lowest = min(c.validation_nll for c in scored)
    chosen = min((c for c in scored if c.validation_nll <= lowest + NLL_TIE),
                 key=lambda c: c.num_experts)
    log(f'NTK-GP chosen: {chosen.gating} x{chosen.num_experts}')
    gp = build(chosen.gating, chosen.num_experts)
    gp.calibrate_probabilities(val_features, val_labels)
    gp.calibrate_ood(val_features)
    gp.calibrate_score(val_features, reference_split)
    return gp, scored


def check_variance_spread(val_variance: np.ndarray, gp: LastLayerNTKGP,
                          train_objects: int) -> None:
    """Refuse a degenerate fit: one whose GP variance is the same for every validation
    object, so that OOD flags and calibrated scores would be decided by round-off.

    It happens when the evidence drives the prior precision up on too few training objects
    for the feature dimension (one fit on 13 objects and D = 64 put it at 1.5e13).
    """
    largest = float(np.max(val_variance)) if len(val_variance) else 0.0
    if len(val_variance) and np.ptp(val_variance) > MIN_RELATIVE_SPREAD * largest > 0.0:
        return
    raise ValueError(
        f'degenerate GP fit: the GP variance of the {len(val_variance)} validation objects is '
        f'the same to 1 part in {1 / MIN_RELATIVE_SPREAD:.0e} ({largest:.3g}; prior precision '
        f'{float(np.max(gp.delta)):.3g}), so it cannot rank them; fit on more found objects '
        f'(this fit had {train_objects} training objects for {gp.feature_dim} features: '
        f'at least {gp.feature_dim + 1} are needed)')


def source_commit() -> str:
    """The git commit of the checkout holding this code (provenance), or ``unknown``."""
    import subprocess

    path = Path(__file__).resolve().parent
    try:
        out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=path, capture_output=True,
                             text=True, timeout=10, check=False)
    except OSError:
        return 'unknown'
    return out.stdout.strip() or 'unknown'


def linear_head(model: CenterNetDetector) -> LinearHead:
    """The detector's classification head as the contract states it (``W``, ``b``)."""
    import torch

    from uq_perception.detectors.contract import LinearHead

    return LinearHead(model.head.weight.detach().to('cpu', torch.float32).numpy(),
                      model.head.bias.detach().to('cpu', torch.float32).numpy())


def _fit_gp_on_splits(model: CenterNetDetector, model_id: str, train: DetectionSplit,
                      val: DetectionSplit, seed: int, progress: bool, log: Any
                      ) -> tuple[LastLayerNTKGP, dict[str, Any]]:
    from uq_perception.training.box_fit import calibrate_box_uncertainty
    from uq_perception.training.detection_scoring import (
        OPERATING_MAX_DETECTIONS,
        OPERATING_THRESHOLD,
    )

    train_phi, train_y = object_embeddings(model, train, progress=progress)
    val_phi, val_y = object_embeddings(model, val, progress=progress)
    gp, candidates = fit_gp(linear_head(model), model.class_names, model_id, train_phi, train_y,
                            val_phi, val_y, seed=seed, log=log)
    # A short training run (a smoke test) may leave a degenerate GP: written, with a warning;
    # the node warns again when it loads it.
    try:
        check_variance_spread(gp.gp_variance(val_phi), gp, len(train_y))
    except ValueError as exc:
        log(f'warning: {exc}')
    box = calibrate_box_uncertainty(model, gp, val, OPERATING_THRESHOLD,
                                    OPERATING_MAX_DETECTIONS, progress=progress)
    if box is None:
        log('box uncertainty not calibrated: too few validation detections match an object '
            '(box_std stays 0)')
    else:
        log(f'box uncertainty calibrated on {box.samples} validation detections: noise '
            f'{[round(v, 5) for v in box.noise]}, GP-variance scale '
            f'{[round(v, 5) for v in box.scale]} ({", ".join(box.coordinates)})')
    summary = {'embeddings': 'matched detections; ground-truth boxes for missed objects',
               'gating': gp.config.gating.value, 'num_experts': gp.num_experts,
               'candidates': [asdict(c) for c in candidates],
               'train_objects': int(len(train_y)), 'val_objects': int(len(val_y)),
               'ood_threshold': gp.ood_threshold, 'probit_lambda': gp.probit_lambda,
               'temperature': gp.temperature,
               'box_calibration': None if box is None else box.to_meta()}
    return gp, summary


def load_training_splits(data: Path | CocoTrainingData, input_size: tuple[int, int],
                         class_names: Sequence[str] | None = None,
                         max_images: int | None = None
                         ) -> tuple[DetectionSplit, DetectionSplit, dict[str, Any]]:
    """Training and validation splits of ``data`` and its provenance for the model's metadata.

    Parameters
    ----------
    data : Path | CocoTrainingData
        A dataset directory of ``uq sim dataset`` (``train/`` and ``val/``), or a COCO
        instances file split at random.
    input_size : tuple[int, int]
        ``(height, width)`` the images are resized to.
    class_names : Sequence[str] | None
        A trained model's classes, which the data's must equal.
    max_images : int | None
        Use only the first images of each split (of the file, for COCO data).
    """
    from uq_perception.training.detector_data import CocoTrainingData, load_coco_splits, load_split

    if isinstance(data, CocoTrainingData):
        train, val, dataset = load_coco_splits(data, input_size, class_names, max_images)
        provenance: dict[str, Any] = {
            'annotations': str(data.annotations), 'sha256': dataset.sha256,
            'images': None if data.images is None else str(data.images),
            'val_fraction': data.val_fraction, 'split_seed': data.seed}
    else:
        train = load_split(data / 'train', input_size, class_names, max_images)
        val = load_split(data / 'val', input_size, train.class_names, max_images)
        manifest_path = data / 'dataset.json'
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        provenance = {'path': str(data), 'seed': manifest.get('seed'), 'n': manifest.get('n'),
                      'counts': manifest.get('counts')}
    provenance.update(train_images=len(train), val_images=len(val))
    return train, val, provenance


def refit_gp(data: Path | CocoTrainingData, out: Path, seed: int = 0, threads: int = 1,
             progress: bool = True, max_images: int | None = None,
             log: Any = _log) -> dict[str, Any]:
    """Fit the NTK-GP again for the trained ``out/detector.pt`` (weights unchanged).

    Rewrites ``detector_gp.npz`` and the GP section of the detector's metadata; the model
    id stays, since it is derived from the weights.
    """
    import torch

    from uq_perception.detectors.centernet import load_detector, save_detector

    torch.set_num_threads(threads)
    model = load_detector(out / DETECTOR_FILE, fold_batchnorm=False)
    train, val, _ = load_training_splits(data, model.input_size, model.class_names,
                                         max_images)
    gp, summary = _fit_gp_on_splits(model, model.model_id, train, val, seed, progress, log)
    save_detector(model, out / DETECTOR_FILE, model_id=model.model_id,
                  metadata={**model.metadata, 'gp': summary})
    gp.save(out / GP_FILE)
    log(f'wrote {out / GP_FILE} for model id {model.model_id}')
    return summary


def run_training(data: Path | CocoTrainingData, out: Path, config: TrainConfig,
                 progress: bool = True, max_images: int | None = None,
                 log: Any = _log) -> dict[str, Any]:
    """Train, fit the GP, save both artefacts; returns a summary (also in the metadata).

    ``data`` is a dataset directory of ``uq sim dataset`` or a COCO instances file split at
    random (:func:`load_training_splits`).
    """
    import torch

    from uq_perception.detectors.centernet import model_digest, save_detector

    started = time.time()
    torch.set_num_threads(config.threads)
    train, val, provenance = load_training_splits(data, config.input_size,
                                                  max_images=max_images)
    log(f'data: {len(train)} train images ({train.num_objects} objects), {len(val)} val '
        f'images ({val.num_objects} objects); classes {train.class_names}')
    model, history = train_detector(train, config, progress=progress, log=log)
    train_seconds = time.time() - started

    from uq_perception.training.detection_scoring import evaluate_detection

    val_metrics = evaluate_detection(model, val, progress=progress)
    log(f'validation AP@0.5 {val_metrics["ap50_mean"]:.4f} '
        f'(per class {val_metrics["ap50_per_class"]})')
    model_id = f'centernet-{model_digest(model)[:16]}'
    gp, gp_summary = _fit_gp_on_splits(model, model_id, train, val, config.seed, progress, log)
    summary = {
        'model_id': model_id,
        'train_config': asdict(config),
        'dataset': provenance,
        'history': history,
        'validation': {k: v for k, v in val_metrics.items() if k != 'latency_ms'},
        'gp': gp_summary,
        'train_seconds': round(train_seconds, 1),
        'total_seconds': round(time.time() - started, 1),
        'torch': str(torch.__version__),
        'git_commit': source_commit(),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_detector(model, out / DETECTOR_FILE, model_id=model_id, metadata=summary)
    gp.save(out / GP_FILE)
    log(f'wrote {out / DETECTOR_FILE} and {out / GP_FILE} (model id {model_id}) in '
        f'{summary["total_seconds"]:.0f} s')
    return summary
