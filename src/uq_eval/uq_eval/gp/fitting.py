"""Fitting and calibrating the NTK-GP of any contract detector on COCO data (ROS-free).

:func:`fit_detector_gp` (behind ``uq gp fit``) takes a detector of the detector contract
(:class:`uq_perception.detectors.contract.DetectorContract`: the shipped CenterNet, or an ONNX file
through the ONNX adapter) and the images of a COCO instances file, split into training and
validation images:

1. It runs the detector over every image, as on the robot (:meth:`infer`, every kept
   detection checked to satisfy ``logits = W phi + b``), matches the detections to the
   annotations (IoU >= 0.5, greedily by score, as detection AP does) and keeps, for every
   annotated object a detection finds, that detection's features ``phi`` and logits: the
   inputs the GP is queried with on the robot. Where the detector gives its candidates
   before NMS (the ONNX adapter), the training objects may also give more points
   (:func:`choose_training_points`): more anchors per found object, and the grid cells in
   the box of an object no detection finds; otherwise objects none finds are counted, not
   used.
2. It fits the GP exactly as ``uq train`` fits the shipped one
   (:func:`uq_perception.training.train.fit_gp`): the gating chosen on held-out validation NLL
   (a multi-scale head gates by scale, :mod:`uq_perception.ntk.scale_gating`),
   the probit factor and temperature calibrated on the validation objects, the OOD
   threshold at the configured quantile of their GP variance; then the calibrated score's
   reference from the same validation objects.
3. It reports the class balance, the evidence of each expert, the OOD threshold, the
   known-vs-unknown AUROC of the GP variance when some categories are unknown objects, and
   the query cost over the forward pass, measured side by side on validation images at the
   node's operating point.

Objects counted are those annotated as single objects (not ``iscrowd``), not flagged
occluded, and at least :data:`uq_perception.training.coco_data.MIN_CLASS_SIDE` pixels on their
shorter side: what the shipped fit also classifies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_perception.detectors.contract import Candidates, DetectorContract, check_linear_head
from uq_perception.training.coco_data import (
    MIN_CLASS_SIDE,
    CategoryRole,
    CocoImage,
    read_image,
)
from uq_perception.training.detection_scoring import (
    AP_MAX_DETECTIONS,
    AP_SCORE_THRESHOLD,
    IOU_THRESHOLD,
    OPERATING_MAX_DETECTIONS,
    OPERATING_THRESHOLD,
)

if TYPE_CHECKING:
    from uq_perception.ntk import LastLayerNTKGP

Roles = Mapping[int, tuple[CategoryRole, int]]
#: Fewest known objects the detector must find in the training images for a GP fit.
MIN_TRAIN_OBJECTS = 2
#: Fewest known validation objects: the gating choice scores one half on the other.
MIN_VAL_OBJECTS = 4
#: The kernel's feature transforms; ``auto`` chooses among the other three.
TRANSFORM_CHOICES = ('auto', 'centre_l2', 'l2', 'none')
#: Fewest unknown objects found for ``auto`` to choose the transform by their AUROC.
MIN_UNKNOWN_FOR_CHOICE = 10
#: Features whose norms vary less than this (coefficient of variation) were normalised
#: by the network itself, as the shipped CenterNet's are.
NORMALISED_NORM_SPREAD = 0.01
#: Anchors per object that ``auto`` compares (1: the matched detection alone).
ANCHOR_CHOICES = (1, 3, 5)
#: Choices of ``missed_objects``: features read in the boxes of objects no detection finds.
MISSED_CHOICES = ('auto', 'on', 'off')
#: Where a training point comes from (:attr:`ObjectFeatures.source`).
SOURCE_MATCHED, SOURCE_ANCHOR, SOURCE_MISSED = 0, 1, 2
#: Label of an unknown object whose category judges the fit: left out of every choice made
#: on unknown objects (other unknown objects have label -1).
JUDGING_LABEL = -2


def check_selection_judging(selection: Sequence[str], judging: Sequence[str]) -> None:
    """Refuse unknown categories named both to choose on (selection) and to judge on.

    Raises
    ------
    ValueError
        Naming the categories in both, in one line.
    """
    both = sorted({n.strip().casefold() for n in selection}
                  & {n.strip().casefold() for n in judging})
    if both:
        raise ValueError(f'unknown categories {both} are both selection and judging '
                         'categories: a choice made on their objects cannot be judged on them')


def _log(message: str) -> None:
    print(message, flush=True)


@dataclass(frozen=True)
class FitSettings:
    """How detections become GP inputs and how the query cost is timed.

    Attributes
    ----------
    score_threshold, max_detections : float, int
        Detections kept per image for matching (low, as for AP: an object found with a low
        score is still one whose features the GP will see).
    iou_threshold : float
        Least IoU of a detection with the object it finds.
    min_side : float
        Least shorter side (pixels) of an object counted.
    timing_images : int
        Validation images timed for the query cost (0: not timed).
    seed : int
        Seed of the GP's k-means and of the gating choice's validation halves.
    feature_transform : str
        The kernel's feature transform (:mod:`uq_perception.ntk.feature_transform`):
        ``centre_l2``, ``l2``, ``none``, or ``auto`` (:func:`choose_feature_transform`).
    anchors_per_object : int | None
        Training points per found known object: 1, the detection matched to it after NMS;
        k > 1, the k highest-scoring anchors or queries matched to it before NMS; ``None``:
        chosen among :data:`ANCHOR_CHOICES` on validation NLL
        (:func:`choose_training_points`).
    missed_objects : str
        ``on``: a known object no detection finds gives the features of the grid cells in
        its box at its assigned scale (grid heads only); ``off``: it gives none; ``auto``:
        chosen on validation NLL.
    selection_categories, judging_categories : tuple[str, ...]
        Unknown categories the choices of the transform and of the score's signal are made
        on, and those the report judges them on (their objects carry
        :data:`JUDGING_LABEL`); a category in both is refused
        (:func:`check_selection_judging`).
    """

    score_threshold: float = AP_SCORE_THRESHOLD
    max_detections: int = AP_MAX_DETECTIONS
    iou_threshold: float = IOU_THRESHOLD
    min_side: float = MIN_CLASS_SIDE
    timing_images: int = 50
    seed: int = 0
    feature_transform: str = 'auto'
    anchors_per_object: int | None = None
    missed_objects: str = 'auto'
    selection_categories: tuple[str, ...] = ()
    judging_categories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_selection_judging(self.selection_categories, self.judging_categories)
        if self.anchors_per_object is not None and not 1 <= self.anchors_per_object <= 100:
            raise ValueError(f'anchors_per_object must be in 1..100, got '
                             f'{self.anchors_per_object}')
        if self.missed_objects not in MISSED_CHOICES:
            raise ValueError(f'missed_objects must be one of {", ".join(MISSED_CHOICES)}, got '
                             f'{self.missed_objects!r}')
        if self.feature_transform not in TRANSFORM_CHOICES:
            raise ValueError(f'feature_transform must be one of {", ".join(TRANSFORM_CHOICES)}, '
                             f'got {self.feature_transform!r}')
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ValueError(f'score_threshold must be in [0, 1], got {self.score_threshold}')
        if not 0.0 < self.iou_threshold <= 1.0:
            raise ValueError(f'iou_threshold must be in (0, 1], got {self.iou_threshold}')
        if self.max_detections < 1:
            raise ValueError(f'max_detections must be >= 1, got {self.max_detections}')
        if not (math.isfinite(self.min_side) and self.min_side >= 0.0):
            raise ValueError(f'min_side must be finite and >= 0, got {self.min_side}')
        if self.timing_images < 0 or self.seed < 0:
            raise ValueError('timing_images and seed must be >= 0')


@dataclass
class Tally:
    """Counts of one split: annotated and found objects per class, and the rest."""

    images: int = 0
    detections: int = 0
    annotated: dict[str, int] = field(default_factory=dict)
    found: dict[str, int] = field(default_factory=dict)
    unknown_annotated: int = 0
    unknown_found: int = 0
    # Detections whose phi or logits are not finite: dropped, never fitted.
    non_finite: int = 0
    # Known objects no detection finds whose box gave grid-cell features.
    missed_read: int = 0

    def to_meta(self) -> dict[str, Any]:
        """JSON-ready counts (the per-class ones are in the report's class balance)."""
        return {'images': self.images, 'detections': self.detections,
                'known': {'annotated': sum(self.annotated.values()),
                          'found': sum(self.found.values()),
                          'missed_read_in_box': self.missed_read},
                'unknown': {'annotated': self.unknown_annotated, 'found': self.unknown_found},
                'non_finite_detections': self.non_finite}


@dataclass(frozen=True)
class ObjectFeatures:
    """Features of the annotated objects that detections found, in image order.

    Attributes
    ----------
    features : np.ndarray
        ``(N, D)`` float32 ``phi`` of the detection that found each object.
    logits : np.ndarray
        ``(N, C)`` float32 its class logits.
    labels : np.ndarray
        ``(N,)`` int64 class index, -1 for unknown objects.
    source, rank : np.ndarray | None
        ``(N,)`` where each point comes from (:data:`SOURCE_MATCHED`: the detection matched
        to the object; :data:`SOURCE_ANCHOR`: an anchor matched to it before NMS;
        :data:`SOURCE_MISSED`: a grid cell in the box of an object no detection finds) and
        its rank among its object's points of that source (1: first); ``None``: all matched.
    """

    features: np.ndarray
    logits: np.ndarray
    labels: np.ndarray
    source: np.ndarray | None = None
    rank: np.ndarray | None = None

    @property
    def known(self) -> np.ndarray:
        """``(N,)`` bool: objects of one of the detector's classes."""
        return self.labels >= 0

    def points(self, anchors_per_object: int = 1, missed_objects: bool = False
               ) -> np.ndarray:
        """``(N,)`` bool: the points of ``anchors_per_object`` anchors per found object
        (1: its matched detection) and, with ``missed_objects``, as many cells per missed
        one."""
        if self.source is None or self.rank is None:
            return np.ones(len(self.labels), bool)
        found = self.source == SOURCE_MATCHED if anchors_per_object == 1 else \
            (self.source == SOURCE_ANCHOR) & (self.rank <= anchors_per_object)
        missed = (self.source == SOURCE_MISSED) & (self.rank <= anchors_per_object)
        return found | (missed if missed_objects else np.zeros_like(missed))

    def subset(self, mask: np.ndarray) -> ObjectFeatures:
        """The points where ``mask`` is true, all counted as matched."""
        return ObjectFeatures(self.features[mask], self.logits[mask], self.labels[mask])


def collect_objects(detector: DetectorContract, images: Sequence[CocoImage], roles: Roles,
                    settings: FitSettings = FitSettings(), progress: bool = False,
                    description: str = 'detections', extra_points: int = 0,
                    missed_cells: bool = False) -> tuple[ObjectFeatures, Tally]:
    """Run ``detector`` over ``images`` and keep the features of every object found.

    With ``extra_points`` > 0 and a detector that gives its candidates before NMS
    (:meth:`DetectorContract.candidates`), each known object also gives up to that many
    more points (:func:`candidate_points`): the highest-scoring anchors matched to it, or,
    with ``missed_cells``, when no detection finds it, the grid cells in its box.

    Raises
    ------
    ValueError
        If an image cannot be read or has another size than its annotations state
        (:class:`~uq_perception.training.coco_data.CocoFormatError`), or the detector's logits are
        not ``W phi + b`` of its features.
    """
    from tqdm import tqdm

    from uq_perception.training.detection_metrics import match_detections

    head = detector.head()
    names = detector.class_names
    tally = Tally(images=len(images), annotated=dict.fromkeys(names, 0),
                  found=dict.fromkeys(names, 0))
    features, logits, labels, source, rank = [], [], [], [], []
    for image in tqdm(images, desc=description, unit='image', disable=not progress):
        rgb = read_image(image)
        detections = detector.infer(rgb, settings.score_threshold, settings.max_detections)
        finite = np.isfinite(detections.embeddings).all(axis=1) & np.isfinite(
            detections.logits).all(axis=1)
        tally.detections += len(detections)
        tally.non_finite += int((~finite).sum())
        check_linear_head(head, detections.embeddings[finite], detections.logits[finite])
        role = [roles[int(c)] for c in image.category_ids]
        counted = ~image.crowd & ~image.occluded & (
            image.boxes[:, 2:].min(axis=1, initial=np.inf) >= settings.min_side)
        matched, _ = match_detections(detections.boxes[finite], detections.scores[finite],
                                      image.boxes, settings.iou_threshold,
                                      gt_ignore=image.crowd)
        found_by = {int(obj): det for det, obj in zip(np.flatnonzero(finite), matched,
                                                      strict=True) if obj >= 0}
        for obj in np.flatnonzero(counted):
            kind, index = role[obj]
            if kind is CategoryRole.AUXILIARY:
                continue
            det = found_by.get(int(obj))
            if kind is CategoryRole.CLASS:
                tally.annotated[names[index]] += 1
                tally.found[names[index]] += det is not None
            else:
                tally.unknown_annotated += 1
                tally.unknown_found += det is not None
            if det is not None:
                features.append(detections.embeddings[det])
                logits.append(detections.logits[det])
                labels.append(index)
                source.append(SOURCE_MATCHED)
                rank.append(1)
        candidates = detector.candidates(rgb) if extra_points > 0 else None
        if candidates is None:
            continue
        known = [int(obj) for obj in np.flatnonzero(counted)
                 if role[obj][0] is CategoryRole.CLASS]
        for target, origin, rows in candidate_points(candidates, image.boxes, image.crowd,
                                                     known, set(found_by), extra_points,
                                                     settings):
            if origin == SOURCE_MISSED and not missed_cells:
                continue
            tally.missed_read += origin == SOURCE_MISSED
            for place, row in enumerate(rows, start=1):
                features.append(candidates.embeddings[row])
                logits.append(candidates.logits[row])
                labels.append(role[target][1])
                source.append(origin)
                rank.append(place)
    d, c = detector.feature_dim, detector.num_classes
    return ObjectFeatures(
        np.asarray(features, np.float32).reshape(-1, d),
        np.asarray(logits, np.float32).reshape(-1, c),
        np.asarray(labels, np.int64).reshape(-1), np.asarray(source, np.int64).reshape(-1),
        np.asarray(rank, np.int64).reshape(-1)), tally


def candidate_points(candidates: Candidates, boxes: np.ndarray, crowd: np.ndarray,
                     known: Sequence[int], found: set[int], count: int,
                     settings: FitSettings) -> list[tuple[int, int, np.ndarray]]:
    """The extra training points of one image's ``known`` objects, as ``(object, source,
    candidate rows best first)``.

    - A found object: the ``count`` highest-scoring candidates (score >= the settings'
      threshold) whose box overlaps it at IoU >= the settings' threshold more than any
      other annotated object (:data:`SOURCE_ANCHOR`).
    - An object no detection finds, on a grid head: the candidates whose cell centre lies
      in its box at its assigned scale, the scale of the in-box cell whose box overlaps it
      most; the ``count`` that overlap it most (:data:`SOURCE_MISSED`).
    """
    from uq_perception.training.detection_metrics import box_iou

    usable = np.isfinite(candidates.boxes).all(axis=1) & np.isfinite(
        candidates.embeddings).all(axis=1) & np.isfinite(candidates.logits).all(axis=1)
    usable &= (candidates.boxes[:, 2:] >= 0).all(axis=1)
    rows = np.flatnonzero(usable)
    single = np.flatnonzero(~crowd)
    if not rows.size or not single.size:
        return []
    iou = box_iou(candidates.boxes[rows], boxes[single])
    owner = single[np.argmax(iou, axis=1)]
    best = iou.max(axis=1)
    column = {int(obj): k for k, obj in enumerate(single)}
    out = []
    for obj in known:
        if obj in found:
            mine = rows[(owner == obj) & (best >= settings.iou_threshold)
                        & (candidates.scores[rows] >= settings.score_threshold)]
            if mine.size:
                order = np.argsort(-candidates.scores[mine], kind='stable')
                out.append((obj, SOURCE_ANCHOR, mine[order][:count]))
            continue
        if candidates.cells is None or candidates.scale is None:
            continue
        cx, cy, w, h = boxes[obj]
        cells = candidates.cells[rows]
        inside = (np.abs(cells[:, 0] - cx) <= w / 2) & (np.abs(cells[:, 1] - cy) <= h / 2)
        if not inside.any():
            continue
        overlap = iou[:, column[obj]]
        assigned = candidates.scale[rows][inside][np.argmax(overlap[inside])]
        mine = np.flatnonzero(inside & (candidates.scale[rows] == assigned))
        order = np.argsort(-overlap[mine], kind='stable')
        out.append((obj, SOURCE_MISSED, rows[mine[order][:count]]))
    return out


def measure_query_cost(detector: DetectorContract, gp: LastLayerNTKGP,
                       images: Sequence[CocoImage], progress: bool = False) -> dict[str, Any]:
    """Time the forward pass and the GP query side by side, image by image.

    Each image runs through :meth:`DetectorContract.infer` at the node's operating point
    (score >= :data:`OPERATING_THRESHOLD`, at most :data:`OPERATING_MAX_DETECTIONS`),
    then :meth:`LastLayerNTKGP.predict` on its detections (variance, probabilities, the
    entropy decomposition: what the node publishes). Reading and decoding the image is
    not timed.

    Returns
    -------
    dict
        ``images``, median ``forward_ms``, ``query_ms`` and ``detections`` per image, and
        ``query_over_forward``, the ratio of the two medians (None without images).
    """
    from tqdm import tqdm

    forward, query, counts = [], [], []
    if images:
        detector.warm_up(2)
    for image in tqdm(images, desc='query cost', unit='image', disable=not progress):
        rgb = read_image(image)
        start = time.perf_counter()
        detections = detector.infer(rgb, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS)
        detector.synchronize()
        middle = time.perf_counter()
        finite = np.isfinite(detections.embeddings).all(axis=1) & np.isfinite(
            detections.logits).all(axis=1)
        gp.predict(detections.embeddings[finite], detections.logits[finite])
        end = time.perf_counter()
        forward.append(middle - start)
        query.append(end - middle)
        counts.append(int(finite.sum()))
    if not forward:
        return {'images': 0, 'forward_ms': None, 'query_ms': None, 'detections': None,
                'query_over_forward': None}
    forward_ms, query_ms = 1e3 * float(np.median(forward)), 1e3 * float(np.median(query))
    return {'images': len(forward), 'forward_ms': round(forward_ms, 3),
            'query_ms': round(query_ms, 4), 'detections': float(np.median(counts)),
            'query_over_forward': round(query_ms / forward_ms, 5) if forward_ms > 0 else None,
            'operating_point': {'score_threshold': OPERATING_THRESHOLD,
                                'max_detections': OPERATING_MAX_DETECTIONS}}


def _fraction(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _class_balance(names: Sequence[str], train: Tally, val: Tally) -> dict[str, Any]:
    return {name: {'train_annotated': train.annotated[name], 'train_found': train.found[name],
                   'val_annotated': val.annotated[name], 'val_found': val.found[name]}
            for name in names}


def fit_detector_gp(detector: DetectorContract, train_images: Sequence[CocoImage],
                    train_roles: Roles, val_images: Sequence[CocoImage], val_roles: Roles,
                    reference_split: str, settings: FitSettings = FitSettings(),
                    progress: bool = False, log: Callable[[str], None] = _log
                    ) -> tuple[LastLayerNTKGP, dict[str, Any]]:
    """Fit and calibrate the NTK-GP of ``detector`` on annotated images (module docstring).

    Parameters
    ----------
    detector : DetectorContract
        The detector; the GP takes its head, class names and model id.
    train_images, val_images : Sequence[CocoImage]
        Images the GP is fitted on, and images it is calibrated and checked on.
    train_roles, val_roles : Roles
        Role and class index of every category of each file
        (:func:`uq_perception.training.coco_data.category_roles` with the detector's classes).
    reference_split : str
        Provenance of the validation objects, stored with the calibrated score's reference.
    settings : FitSettings
        Matching and timing settings.
    progress : bool
        Show progress bars.
    log : callable
        Receives one line per step.

    Returns
    -------
    tuple[LastLayerNTKGP, dict]
        The fitted, calibrated GP (not yet saved) and the report.

    Raises
    ------
    ValueError
        On unreadable images, a detector that breaks the contract, or too few found known
        objects to fit (:data:`MIN_TRAIN_OBJECTS`) or calibrate (:data:`MIN_VAL_OBJECTS`).
    """
    from uq_perception.ntk.feature_transform import FeatureBlock, FeatureTransform
    from uq_perception.training.metrics import auroc
    from uq_perception.training.ood_baselines import format_table
    from uq_perception.training.train import check_variance_spread, fit_gp

    if not train_images or not val_images:
        raise ValueError(f'need training and validation images, got {len(train_images)} and '
                         f'{len(val_images)}')
    names = detector.class_names
    started = time.perf_counter()
    extra, grid = extra_points_available(detector, settings)
    collected, train_tally = collect_objects(detector, train_images, train_roles, settings,
                                             progress, 'detections train', extra,
                                             grid and settings.missed_objects != 'off')
    # The detections matched to objects, as before any extra point: the GP's validation,
    # its transform choice and the post-hoc scores' reference.
    train = collected.subset(collected.points())
    val, val_tally = collect_objects(detector, val_images, val_roles, settings, progress,
                                     'detections val')
    for split, objects, tally, least in (('training', train, train_tally, MIN_TRAIN_OBJECTS),
                                         ('validation', val, val_tally, MIN_VAL_OBJECTS)):
        found, annotated = int(objects.known.sum()), sum(tally.annotated.values())
        log(f'{split}: {len(objects.labels)} objects found by {tally.detections} detections in '
            f'{tally.images} images; known {found} of {annotated} annotated')
        if found < least:
            raise ValueError(
                f'the detector found {found} of the {annotated} known objects annotated in the '
                f'{split} images; at least {least} are needed (are the class names and boxes '
                'those of this model, and the images what it was trained on?)')
    train_known, val_known = train.known, val.known
    found_unknown = ObjectFeatures(np.concatenate([train.features[~train_known],
                                                   val.features[~val_known]]),
                                   np.concatenate([train.logits[~train_known],
                                                   val.logits[~val_known]]),
                                   np.concatenate([train.labels[~train_known],
                                                   val.labels[~val_known]]))
    # Objects of judging categories choose nothing; with none declared, the choices and the
    # report share the unknown objects (the report then leans optimistic).
    judged_apart = bool(settings.judging_categories)
    for_judging = found_unknown.labels == JUDGING_LABEL
    unknown = found_unknown.subset(~for_judging)
    judged = found_unknown.subset(for_judging) if judged_apart else unknown
    blocks = tuple(FeatureBlock(*b) for b in detector.feature_blocks())
    # A head with several scales gates by scale: each scale's own noise, prior precision,
    # OOD threshold and score reference make calibrated_score mean the same at every scale.
    by_scale: dict[str, Any] = {'candidates': (('scale', 0),), 'scale_blocks': blocks} \
        if len(blocks) > 1 else {}

    def fit_with(kind: str, points: ObjectFeatures | None = None
                 ) -> tuple[LastLayerNTKGP, list[Any]]:
        fitted_on = points if points is not None else train.subset(train_known)
        transform = None if kind == 'none' else FeatureTransform.fitted(
            fitted_on.features, blocks, centre=kind == 'centre_l2')
        return fit_gp(detector.head(), names, detector.model_id,
                      fitted_on.features, fitted_on.labels,
                      val.features[val_known], val.labels[val_known], seed=settings.seed,
                      log=log, reference_split=reference_split, feature_transform=transform,
                      **by_scale)

    transform_choice = choose_feature_transform(
        settings.feature_transform, train.features[train_known], val.features[val_known],
        unknown.features, fit_with, log)
    points_choice = choose_training_points(
        settings, collected, extra > 0, grid, transform_choice.pop('fitted'),
        lambda points: fit_with(transform_choice['kind'], points), log)
    (gp, candidates), fitted_on = points_choice.pop('fitted')
    # Never written silently: the node would publish flags and scores decided by round-off.
    check_variance_spread(gp.gp_variance(val.features[val_known]), gp, len(fitted_on.labels))
    signal_choice = choose_score_signal(gp, val.features[val_known], val.logits[val_known],
                                        unknown, reference_split, detector.class_activation,
                                        log)
    reference = gp.score_reference
    if reference is None:
        raise RuntimeError('the GP fit left no calibrated-score reference')
    val_variance = gp.gp_variance(val.features[val_known])
    threshold = float(gp.ood_threshold) if gp.ood_threshold is not None else math.inf
    experts = np.bincount(gp.predict(fitted_on.features).expert_id, minlength=gp.num_experts)
    unknown_variance = gp.gp_variance(judged.features)
    unknown_report: dict[str, Any] = {
        'judged_on': {'judging': list(settings.judging_categories),
                      'selection': list(settings.selection_categories)} if judged_apart
        else 'the unknown objects the choices were made on',
        'objects': int(unknown_variance.size),
        'annotated': train_tally.unknown_annotated + val_tally.unknown_annotated,
        'known_objects': int(val_variance.size),
        'auroc': None, 'flagged_ood': _fraction(int((unknown_variance > threshold).sum()),
                                                unknown_variance.size)}
    if unknown_variance.size:
        # Known side: validation objects (never fitted on); unknown side: every unknown
        # object found, in training or validation images (the GP never sees them).
        unknown_report['auroc'] = round(auroc(
            np.concatenate([val_variance, unknown_variance]),
            np.r_[np.zeros(val_variance.size, bool), np.ones(unknown_variance.size, bool)]), 4)
        log(f'known-vs-unknown AUROC of the GP variance: {unknown_report["auroc"]} '
            f'({val_variance.size} known validation, {unknown_variance.size} unknown objects)')
        unknown_report['scores'] = ood_score_rows(
            gp, detector.class_activation, train.features[train_known],
            train.labels[train_known], ObjectFeatures(val.features[val_known],
                                                      val.logits[val_known],
                                                      val.labels[val_known]), judged)
        log('known-vs-unknown, the GP beside the post-hoc scores on the same detections:\n'
            + format_table(unknown_report['scores']))
    fit_seconds = time.perf_counter() - started
    timed = list(val_images[:settings.timing_images])
    cost = measure_query_cost(detector, gp, timed, progress)
    if cost['query_over_forward'] is not None:
        log(f'query cost {cost["query_ms"]:.3f} ms per image over a {cost["forward_ms"]:.2f} ms '
            f'forward pass: {cost["query_over_forward"]:.4f} ({cost["images"]} images)')
    accuracy = float(np.mean(np.argmax(val.logits[val_known], axis=1) == val.labels[val_known]))
    report = {
        'class_balance': _class_balance(names, train_tally, val_tally),
        'counts': {'train': train_tally.to_meta(), 'val': val_tally.to_meta()},
        'gp': {
            'gating': gp.config.gating.value, 'num_experts': gp.num_experts,
            'candidates': [{'gating': c.gating, 'num_experts': c.num_experts,
                            'held_out_validation_nll': round(c.validation_nll, 5)}
                           for c in candidates],
            'experts': [{'train_objects': int(experts[e]),
                         'sigma2': float(gp.sigma2[e]), 'delta': float(gp.delta[e]),
                         'log_evidence': round(gp.log_marginal_likelihood(e), 4)}
                        for e in range(gp.num_experts)],
            'feature_transform': transform_choice,
            'scales': None if gp.scale_gating is None else [
                {'validation_objects': count, 'ood_threshold': threshold,
                 'own_score_reference': own is not None}
                for count, threshold, own in zip(gp.scale_gating.validation_counts,
                                                 gp.scale_gating.ood_thresholds,
                                                 gp.scale_gating.references, strict=True)],
            'training_points': points_choice,
            'score_signal': signal_choice,
            'probit_lambda': gp.probit_lambda, 'temperature': gp.temperature,
            'ood_quantile': gp.config.ood_quantile, 'ood_threshold': gp.ood_threshold,
            'score_reference': {'split': reference.split, 'objects': reference.count,
                                'variance_median': float(np.median(val_variance)),
                                'variance_max': reference.maximum},
        },
        'validation': {'known_objects': int(val_known.sum()),
                       'accuracy': round(accuracy, 4),
                       'flagged_ood': _fraction(int((val_variance > threshold).sum()),
                                                val_variance.size)},
        'unknown': unknown_report,
        'query_cost': cost,
        'settings': {'score_threshold': settings.score_threshold,
                     'max_detections': settings.max_detections,
                     'iou_threshold': settings.iou_threshold, 'min_side': settings.min_side,
                     'seed': settings.seed, 'feature_transform': settings.feature_transform,
                     'anchors_per_object': settings.anchors_per_object,
                     'missed_objects': settings.missed_objects},
        'fit_seconds': round(fit_seconds, 1),
    }
    log(f'NTK-GP {gp.config.gating.value} x{gp.num_experts}: OOD threshold '
        f'{gp.ood_threshold:.4g} (the {gp.config.ood_quantile:.0%} quantile of '
        f'{val_variance.size} validation objects\' GP variance)')
    return gp, report


def extra_points_available(detector: DetectorContract, settings: FitSettings
                           ) -> tuple[int, bool]:
    """How many extra points per object to collect (0: none) and whether the detector's
    candidates lie on a grid (missed objects' cells can be read).

    Raises
    ------
    ValueError
        When the settings ask for anchors before NMS or missed objects' cells and the
        detector cannot give them.
    """
    wanted = settings.anchors_per_object != 1 or settings.missed_objects != 'off'
    if not wanted:
        return 0, False
    height, width = detector.input_size
    probe = detector.candidates(np.zeros((height, width, 3), np.uint8))
    if probe is None:
        if settings.anchors_per_object not in (None, 1) or settings.missed_objects == 'on':
            raise ValueError(f'{detector.backend_name} gives no candidates before NMS: set '
                             '--anchors-per-object 1 and --missed-objects off')
        return 0, False
    grid = probe.cells is not None
    if settings.missed_objects == 'on' and not grid:
        raise ValueError('--missed-objects on reads grid cells; this detector\'s head has no '
                         'grid (set prediction): set --missed-objects off')
    count = max(ANCHOR_CHOICES) if settings.anchors_per_object is None \
        else settings.anchors_per_object
    return count, grid


def choose_training_points(settings: FitSettings, collected: ObjectFeatures, extra: bool,
                           grid: bool, matched_fit: tuple[Any, Any],
                           fit_with: Callable[[ObjectFeatures], tuple[Any, Any]],
                           log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Choose the GP's training points: anchors per found object and whether missed
    objects give their cells (:meth:`ObjectFeatures.points`), and say why.

    Settings named are used as named; ``auto`` ones are chosen on validation: the option
    whose fit has the lowest held-out validation NLL (the gating choice's, on the known
    validation objects' matched detections, the node's view), ties to the fewer points.
    ``matched_fit`` is the fit on the matched detections alone (1 anchor, no missed
    objects). Returns the record, with ``(fit, points)`` under ``fitted``.
    """
    known = collected.known
    anchors = [settings.anchors_per_object] if settings.anchors_per_object is not None \
        else list(ANCHOR_CHOICES) if extra else [1]
    missed = [settings.missed_objects == 'on'] if settings.missed_objects != 'auto' \
        else [False, True] if grid else [False]
    options = [(k, m) for m in missed for k in anchors]
    fits: dict[tuple[int, bool], tuple[Any, ObjectFeatures]] = {}
    for k, m in options:
        points = collected.subset(collected.points(k, m) & known)
        fits[(k, m)] = (matched_fit if (k, m) == (1, False) else fit_with(points), points)
    record: dict[str, Any] = {'setting': {'anchors_per_object': settings.anchors_per_object,
                                          'missed_objects': settings.missed_objects}}
    if len(options) == 1:
        chosen = options[0]
        record['rule'] = 'named'
    else:
        nll = {option: min(c.validation_nll for c in fits[option][0][1])
               for option in options}
        chosen = min(options, key=lambda o: (nll[o], len(fits[o][1].labels)))
        record['rule'] = 'lowest held-out validation NLL'
        record['validation_nll'] = [
            {'anchors_per_object': k, 'missed_objects': m, 'train_points':
             len(fits[(k, m)][1].labels), 'validation_nll': round(float(nll[(k, m)]), 5)}
            for k, m in options]
        log('training points: ' + ', '.join(
            f'{k} anchor(s){" + missed" if m else ""} NLL {nll[(k, m)]:.5f} '
            f'({len(fits[(k, m)][1].labels)} points)' for k, m in options))
    k, m = chosen
    record.update(anchors_per_object=k, missed_objects=m,
                  train_points=len(fits[chosen][1].labels),
                  missed_points=int(((collected.source == SOURCE_MISSED)
                                     & collected.points(k, m)).sum())
                  if collected.source is not None else 0)
    log(f'training points chosen: {k} per found object'
        + (', cells of missed objects' if m else '') + f' ({record["train_points"]} points, '
        f'{record["rule"]})')
    record['fitted'] = fits[chosen]
    return record


def choose_feature_transform(setting: str, train_features: np.ndarray,
                             val_features: np.ndarray, unknown_features: np.ndarray,
                             fit_with: Callable[[str], tuple[Any, Any]],
                             log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Fit the GP with the kernel's feature transform that ``setting`` names or ``auto``
    chooses, and say why.

    ``auto`` chooses on the data, never on the test set:

    - with at least :data:`MIN_UNKNOWN_FOR_CHOICE` unknown objects found in the training
      and validation images, the transform whose GP variance separates them best from the
      known validation objects (AUROC);
    - else ``none`` when the network normalised its features itself (their norms vary by
      less than :data:`NORMALISED_NORM_SPREAD`), and ``centre_l2`` otherwise.

    Returns the record of the choice (the report's ``feature_transform``), with the fitted
    ``(gp, gating candidates)`` under ``fitted``.
    """
    from uq_perception.training.metrics import auroc

    norms = np.linalg.norm(np.asarray(train_features, np.float64), axis=1)
    norm_spread = float(norms.std() / norms.mean()) if norms.size and norms.mean() > 0 else 0.0
    record: dict[str, Any] = {'setting': setting,
                              'train_norm_spread': round(norm_spread, 5)}
    if setting != 'auto':
        record.update(kind=setting, rule='named')
        record['fitted'] = fit_with(setting)
        return record
    if len(unknown_features) >= MIN_UNKNOWN_FOR_CHOICE:
        aurocs, fits = {}, {}
        for kind in ('centre_l2', 'l2', 'none'):
            fits[kind] = fit_with(kind)
            gp = fits[kind][0]
            known, unknown = gp.gp_variance(val_features), gp.gp_variance(unknown_features)
            aurocs[kind] = round(auroc(np.r_[known, unknown],
                                       np.r_[np.zeros(len(known), bool),
                                             np.ones(len(unknown), bool)]), 4)
            log(f'feature transform {kind}: known-vs-unknown AUROC of the GP variance '
                f'{aurocs[kind]}')
        kind = max(aurocs, key=lambda k: aurocs[k])
        record.update(kind=kind, rule=f'best AUROC on {len(unknown_features)} unknown objects '
                                      'of the training and validation images',
                      auroc_by_kind=aurocs)
        record['fitted'] = fits[kind]
    else:
        kind = 'none' if norm_spread < NORMALISED_NORM_SPREAD else 'centre_l2'
        record.update(kind=kind, rule=(
            f'fewer than {MIN_UNKNOWN_FOR_CHOICE} unknown objects: feature norms vary by '
            f'{norm_spread:.3g} of their mean, '
            + ('already normalised by the network' if kind == 'none'
               else 'so centred and normalised per block')))
        record['fitted'] = fit_with(kind)
    log(f'feature transform chosen: {kind} ({record["rule"]})')
    return record


def predictive_signals(gp: LastLayerNTKGP, features: np.ndarray, logits: np.ndarray,
                       activation: str) -> dict[str, np.ndarray]:
    """Every signal a calibrated score may rank for this detector (``SCORE_SIGNALS``; the
    lower-quantile confidence with the detector's own ``activation``), from one query of the
    GP's predictive at the detections' own logits; with the GP's calibrated score under
    ``calibrated_score`` when it has a reference."""
    from uq_perception.ntk.calibrated_score import score_signal

    out = gp.predict(features, logits)
    names = ('gp_variance', 'predictive_entropy', 'mutual_information', 'predictive_msp',
             f'predictive_lcb_{activation}', 'predictive_lcb_energy')
    signals = {name: score_signal(name, out.logits, out.gp_variance, out.predictive_entropy,
                                  out.mutual_information, out.probabilities) for name in names}
    if out.calibrated_score is not None:
        signals['calibrated_score'] = out.calibrated_score
    return signals


def choose_score_signal(gp: LastLayerNTKGP, val_features: np.ndarray, val_logits: np.ndarray,
                        unknown: ObjectFeatures, reference_split: str, activation: str,
                        log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Choose what the calibrated score ranks, and set its reference on the validation
    objects.

    The rule: with at least :data:`MIN_UNKNOWN_FOR_CHOICE` unknown objects found in the
    training and validation images, the signal of the GP's predictive (``SCORE_SIGNALS``)
    that separates them best from the known validation objects (AUROC; the GP variance
    wins ties); otherwise the GP variance, as without a choice. Returns the record of it.
    """
    from uq_perception.training.metrics import auroc

    if len(unknown.labels) < MIN_UNKNOWN_FOR_CHOICE:
        return {'signal': 'gp_variance',
                'rule': f'fewer than {MIN_UNKNOWN_FOR_CHOICE} unknown objects: the GP variance'}
    known = predictive_signals(gp, val_features, val_logits, activation)
    other = predictive_signals(gp, unknown.features, unknown.logits, activation)
    # Candidates are the signals themselves, not the score the current reference gives.
    known.pop('calibrated_score', None)
    other.pop('calibrated_score', None)
    targets = np.r_[np.zeros(len(val_features), bool), np.ones(len(unknown.labels), bool)]
    aurocs = {name: round(auroc(np.r_[known[name], other[name]], targets), 4)
              for name in known}
    signal = max(aurocs, key=lambda name: (aurocs[name], name == 'gp_variance'))
    gp.calibrate_score(val_features, reference_split, signal=signal, logits=val_logits)
    log(f'calibrated score ranks {signal}: known-vs-unknown AUROC '
        + ', '.join(f'{name} {value}' for name, value in aurocs.items()))
    return {'signal': signal, 'rule': f'best AUROC on {len(unknown.labels)} unknown objects '
                                      'of the training and validation images',
            'auroc_by_signal': aurocs}


def ood_score_rows(gp: LastLayerNTKGP, activation: str, train_features: np.ndarray,
                   train_labels: np.ndarray, known: ObjectFeatures,
                   unknown: ObjectFeatures) -> list[dict[str, Any]]:
    """AUROC and FPR95 of the GP's predictive signals, its calibrated score, a fused score
    and every post-hoc baseline (:mod:`uq_perception.training.ood_baselines`), known
    objects against unknown ones, all on the same detections.

    The fused score is the mean of two quantiles among the known objects: the calibrated
    score and the MSP's quantile. It is reported beside the others, never published.
    """
    from uq_perception.training.ood_baselines import FeatureBank, baseline_scores, score_table

    bank = FeatureBank.fitted(train_features, train_labels)
    per_side = []
    for objects in (known, unknown):
        scores = predictive_signals(gp, objects.features, objects.logits, activation)
        scores.update(baseline_scores(objects.logits, objects.features, bank, activation))
        per_side.append(scores)
    known_scores, unknown_scores = per_side
    if 'calibrated_score' in known_scores:
        msp_sorted = np.sort(known_scores['msp'])
        for scores in per_side:
            msp_quantile = np.searchsorted(msp_sorted, scores['msp'], side='right') \
                / len(msp_sorted)
            scores['fused_gp_msp'] = 0.5 * (scores['calibrated_score'] + msp_quantile)
    return score_table(known_scores, unknown_scores)
