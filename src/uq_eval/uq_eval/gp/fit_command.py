"""``uq gp fit``: fit and calibrate the NTK-GP of a detector on a COCO dataset.

The detector is the shipped CenterNet (``.pt``) or any ONNX detector with a linear class
head, read through the ONNX adapter (``.onnx``, settings as the detector node's); the data
is a COCO instances file and its images, as CVAT, Label Studio and FiftyOne export them.
Validation images are a random part of the file (``--val-fraction``) or a second file
(``--val-annotations``). The command writes the GP artefact (``--out``, the file the
detector node's ``gp_path`` reads) and a JSON report with its provenance (``--report``),
and prints a summary. Bad input (a corrupt file, a missing or mis-sized image, a category
that is none of the model's classes, an unusable model) exits with status 2 and one line,
and writes nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uq_common.arguments import non_negative_int, open_fraction, positive_int, unit_interval

if TYPE_CHECKING:
    from uq_perception.detectors.contract import DetectorContract
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.runtime.loading import ModelFormat


#: ``--model-format`` choice that reads the format from the file name.
AUTO_FORMAT = 'auto'
#: ONNX adapter settings: option name -> (OnnxAdapterConfig field, help).
_ADAPTER_OPTIONS = {
    'layout': ('layout', 'head layout: auto, yolo or detr'),
    'class_nodes': ('class_nodes', 'names of the class-logit nodes; none: found automatically'),
    'input_size': ('input_size', 'network input H W; none: the model\'s static input shape'),
    'resize': ('resize', 'auto (stretch for an RT-DETR named in the metadata), letterbox or '
                         'stretch'),
    'pad_value': ('pad_value', 'grey level 0-255 of letterbox padding'),
    'channel_order': ('channel_order', 'rgb or bgr'),
    'mean': ('mean', 'per-channel mean subtracted after scaling to [0, 1]'),
    'std': ('std', 'per-channel standard deviation divided by'),
    'box_format': ('box_format', 'auto, cxcywh, xyxy, cxcywh-normalized, xyxy-normalized'),
    'score_activation': ('score_activation', 'auto, sigmoid or softmax'),
    'nms': ('nms', 'auto, class, agnostic or none'),
    'nms_iou': ('nms_iou', 'IoU above which NMS suppresses a box'),
    'max_candidates': ('max_candidates', 'most candidates entering NMS'),
    'class_names': ('class_names', 'the model\'s class names; none: from its metadata'),
}


def add_detector_arguments(parser: argparse.ArgumentParser,
                           default_model: Path | None = None) -> None:
    """The detector and how to run it: ``--model`` (required unless ``default_model``) and
    the ONNX adapter's settings."""
    parser.add_argument('--model', type=Path, required=default_model is None,
                        default=default_model,
                        help='the detector: the shipped format (.pt) or an ONNX file')
    parser.add_argument('--model-format', default=AUTO_FORMAT,
                        choices=[AUTO_FORMAT, 'torch', 'onnx'],
                        help='how to read --model, as the node\'s model_format (auto: .onnx is '
                             'onnx, .pt and .pth torch)')
    parser.add_argument('--threads', type=positive_int, default=1,
                        help='CPU threads of the network')
    parser.add_argument('--provider', default='cpu',
                        help='ONNX Runtime execution provider: cpu, cuda or tensorrt')
    adapter = parser.add_argument_group('ONNX adapter settings, for --model-format onnx '
                                        '(docs/detector_contract.md)')
    for option, (_, text) in _ADAPTER_OPTIONS.items():
        flag = '--' + option.replace('_', '-')
        if option in ('class_nodes', 'class_names'):
            adapter.add_argument(flag, nargs='+', default=None, help=text)
        elif option in ('mean', 'std'):
            adapter.add_argument(flag, nargs=3, type=float, default=None, metavar='V',
                                 help=text)
        elif option == 'input_size':
            adapter.add_argument(flag, nargs=2, type=positive_int, default=None,
                                 metavar=('H', 'W'), help=text)
        elif option in ('pad_value', 'max_candidates'):
            adapter.add_argument(flag, type=int, default=None, help=text)
        elif option == 'nms_iou':
            adapter.add_argument(flag, type=float, default=None, help=text)
        else:
            adapter.add_argument(flag, default=None, help=text)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The COCO data, their training / validation split and the categories' roles."""
    parser.add_argument('--annotations', type=Path, required=True,
                        help='COCO instances JSON (CVAT, Label Studio, FiftyOne export)')
    parser.add_argument('--images', type=Path, default=None,
                        help='folder of the images; none: found beside the JSON')
    parser.add_argument('--val-annotations', type=Path, default=None,
                        help='a second COCO file of validation images; none: a random '
                             '--val-fraction of --annotations')
    parser.add_argument('--val-images', type=Path, default=None,
                        help='folder of the --val-annotations images')
    parser.add_argument('--val-fraction', type=open_fraction, default=0.2,
                        help='fraction of the images held out for validation')
    parser.add_argument('--seed', type=non_negative_int, default=0,
                        help='seed of the split, of k-means and of the gating choice')
    parser.add_argument('--unknown', nargs='+', default=[], metavar='CATEGORY',
                        help='categories of objects no class fits (scored for the '
                             'known-vs-unknown AUROC); supercategory "unknown" also marks them')
    parser.add_argument('--ignore', nargs='+', default=[], metavar='CATEGORY',
                        help='categories left out (neither fitted nor scored); supercategory '
                             '"auxiliary" also marks them')
    parser.add_argument('--max-images', type=positive_int, default=None,
                        help='use only the first images of each file (quick runs)')


def configure(parser: argparse.ArgumentParser) -> None:
    """Fit and calibrate the NTK-GP of a detector (.pt or .onnx) on a COCO dataset."""
    from uq_eval.gp.fitting import MISSED_CHOICES, TRANSFORM_CHOICES
    from uq_perception.training.detection_scoring import AP_SCORE_THRESHOLD

    add_detector_arguments(parser)
    add_data_arguments(parser)
    parser.add_argument('--out', type=Path, required=True,
                        help='GP artefact to write (.npz, the node\'s gp_path)')
    parser.add_argument('--report', type=Path, default=None,
                        help='JSON report to write; none: --out with suffix .json')
    parser.add_argument('--score-threshold', type=unit_interval, default=AP_SCORE_THRESHOLD,
                        help='least detection score of a detection matched to an object (low, '
                             'as for AP: an object found with a low score is still one whose '
                             'features the GP sees)')
    parser.add_argument('--feature-transform', default='auto', choices=TRANSFORM_CHOICES,
                        help='the kernel\'s feature transform, per block (YOLO scale): '
                             'centre_l2 (centre on the training mean, then L2-normalise to '
                             'radius sqrt(d)), l2, none; auto chooses on the data '
                             '(docs/gp_fit.md)')
    parser.add_argument('--anchors-per-object', type=_anchors_argument, default=None,
                        metavar='K', help='training points per found known object: 1, the '
                        'detection matched to it; K > 1, its K best-scoring anchors or queries '
                        'before NMS; auto (default): 1, 3 or 5, whichever gives the lowest '
                        'validation NLL (docs/gp_fit.md)')
    parser.add_argument('--missed-objects', default='auto', choices=MISSED_CHOICES,
                        help='on: a known object no detection finds gives the features of the '
                             'grid cells in its box (YOLO layout); auto: on when it lowers the '
                             'validation NLL')
    parser.add_argument('--select-on', nargs='+', default=[], metavar='CATEGORY',
                        help='unknown categories whose objects choose the feature transform '
                             'and the score\'s signal; none: every unknown category not '
                             'judged on')
    parser.add_argument('--judge-on', nargs='+', default=[], metavar='CATEGORY',
                        help='unknown categories held out of those choices, whose objects '
                             'alone the report scores; none: the report scores the objects '
                             'the choices were made on')
    parser.add_argument('--timing-images', type=non_negative_int, default=50,
                        help='validation images timed for the query cost (0: none)')
    parser.add_argument('--no-progress', action='store_true',
                        help='hide progress bars and step lines (the summary stays)')
    parser.set_defaults(run=run)
    parser.set_defaults(run=run)


def _anchors_argument(text: str) -> int | None:
    """argparse type of ``--anchors-per-object``: ``auto`` (None) or an integer 1..100."""
    if text == 'auto':
        return None
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected auto or a whole number, got {text!r}'
                                         ) from None
    if not 1 <= count <= 100:
        raise argparse.ArgumentTypeError(f'must be auto or 1..100, got {count}')
    return count


def _one_line(exc: BaseException) -> str:
    return ' '.join(str(exc).split()) or type(exc).__name__


def _model_format(args: argparse.Namespace) -> ModelFormat:
    from uq_perception.runtime.loading import ModelFormat

    if args.model_format != AUTO_FORMAT:
        return ModelFormat(args.model_format)
    suffix = args.model.suffix.lower()
    if suffix == '.onnx':
        return ModelFormat.ONNX
    if suffix in ('.pt', '.pth'):
        return ModelFormat.TORCH
    raise ValueError(f'cannot tell the format of {args.model} from its name; set '
                     '--model-format torch or onnx')


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for block in iter(lambda: handle.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def open_detector(args: argparse.Namespace) -> tuple[DetectorContract, dict[str, Any]]:
    """The contract detector ``args`` name, opened as the detector node opens it
    (:mod:`uq_perception.runtime.loading`), and its description for the report.

    The shipped format runs on ``pytorch-cpu``, the reference its other backends are
    checked against; an ONNX model on ONNX Runtime with ``--provider``.

    Raises
    ------
    ValueError
        On a missing or unreadable model, adapter settings for a torch model, or settings
        out of their rules.
    uq_perception.runtime.onnx_runtime.OnnxRuntimeUnavailableError
        When ONNX Runtime or the provider is missing.
    """
    import torch

    from uq_perception.runtime.backends import BackendKind
    from uq_perception.runtime.loading import (
        ModelFormat,
        RuntimeSettings,
        load_model,
        start_detector,
    )
    from uq_perception.runtime.onnx_adapter import OnnxAdapterConfig, OnnxDetector

    chosen = _model_format(args)
    settings = {field: getattr(args, option) for option, (field, _) in _ADAPTER_OPTIONS.items()
                if getattr(args, option) is not None}
    if not args.model.is_file():
        raise ValueError(f'model file not found: {args.model}')
    if chosen is ModelFormat.TORCH and settings:
        raise ValueError(f'ONNX adapter settings ({", ".join(sorted(settings))}) apply to '
                         'ONNX models only')
    for name in ('class_nodes', 'class_names', 'mean', 'std', 'input_size'):
        if name in settings:
            settings[name] = tuple(settings[name])
    runtime = RuntimeSettings(
        backend=BackendKind.ONNXRUNTIME if chosen is ModelFormat.ONNX
        else BackendKind.PYTORCH_CPU, onnx_provider=args.provider, onnx_threads=args.threads)
    torch.set_num_threads(args.threads)
    loaded = load_model(chosen, args.model, runtime, OnnxAdapterConfig(**settings)
                        if chosen is ModelFormat.ONNX else None)
    detector, _ = start_detector(loaded, runtime)
    info = {'path': str(args.model), 'format': chosen.value,
            'sha256': _file_sha256(args.model), 'model_id': detector.model_id,
            'classes': detector.class_names, 'feature_dim': detector.feature_dim,
            'input_size': list(detector.input_size), 'backend': detector.backend_name,
            'device': detector.device_name,
            'adapter': detector.describe() if isinstance(detector, OnnxDetector) else None}
    return detector, info


def _split_label(text: str) -> str:
    """The score reference's provenance text: printable, at most 200 characters."""
    return text if text.isprintable() and len(text) <= 200 else 'validation objects'


def _load_data(args: argparse.Namespace, class_names: list[str],
               selection: Sequence[str] = (), judging: Sequence[str] = ()) -> dict[str, Any]:
    """Read the COCO file(s), the roles of their categories and the train/val images;
    unknown categories of ``judging`` get :data:`~uq_eval.gp.fitting.JUDGING_LABEL`, and,
    with ``selection`` named, unknown categories in neither are left out."""
    from uq_perception.training.coco_data import (
        CategoryRole,
        CocoFormatError,
        category_roles,
        read_coco,
        split_indices,
    )

    train_set = read_coco(args.annotations, args.images, args.max_images)
    files = [train_set]
    if args.val_annotations is not None:
        val_set = read_coco(args.val_annotations, args.val_images, args.max_images)
        files.append(val_set)
    elif args.val_images is not None:
        raise ValueError('--val-images names the folder of --val-annotations images')
    # A name must be a category of some file; each file takes the names it has.
    for what, names in (('unknown', args.unknown), ('ignored', args.ignore)):
        present = {c.name.casefold() for f in files for c in f.categories.values()}
        strays = [n for n in names if n.strip().casefold() not in present]
        if strays:
            raise CocoFormatError(f'{what} categories {strays} are in no annotations file')

    def roles_of(dataset: Any) -> Any:
        own = {c.name.casefold() for c in dataset.categories.values()}
        return category_roles(
            dataset, class_names,
            unknown=[n for n in args.unknown if n.strip().casefold() in own],
            ignored=[n for n in args.ignore if n.strip().casefold() in own])[0]

    def split_unknown(roles: Any, dataset: Any) -> Any:
        # Judging categories choose nothing; with selection categories named, other unknown
        # categories are left out.
        from uq_eval.gp.fitting import JUDGING_LABEL

        names = {c.id: c.name.strip().casefold() for c in dataset.categories.values()}
        judge = {n.strip().casefold() for n in judging}
        select = {n.strip().casefold() for n in selection}
        out = dict(roles)
        for cid, (role, index) in roles.items():
            if role is not CategoryRole.UNKNOWN:
                continue
            if names[cid] in judge:
                out[cid] = (role, JUDGING_LABEL)
            elif select and names[cid] not in select:
                out[cid] = (CategoryRole.AUXILIARY, index)
        return out

    unknown_names = {c.name.strip().casefold() for f in files for c in f.categories.values()
                     if roles_of(f)[c.id][0] is CategoryRole.UNKNOWN}
    for what, named in (('selection', selection), ('judging', judging)):
        strays = [n for n in named if n.strip().casefold() not in unknown_names]
        if strays:
            raise CocoFormatError(f'{what} categories {strays} are no unknown category')
    train_roles = split_unknown(roles_of(train_set), train_set)
    data: dict[str, Any] = {
        'annotations': str(args.annotations), 'sha256': train_set.sha256,
        'images_dir': None if args.images is None else str(args.images),
        'categories': {c.name: train_roles[c.id][0].value
                       for c in train_set.categories.values()}}
    if args.val_annotations is not None:
        val_set = files[1]
        train_images, val_images = list(train_set.images), list(val_set.images)
        val_roles = split_unknown(roles_of(val_set), val_set)
        data['validation'] = {'annotations': str(args.val_annotations),
                              'sha256': val_set.sha256,
                              'images_dir': None if args.val_images is None
                              else str(args.val_images)}
        reference = (f'validation file {args.val_annotations.parent.name}/'
                     f'{args.val_annotations.name}')
    else:
        train_index, val_index = split_indices(len(train_set), args.val_fraction, args.seed)
        train_images = [train_set.images[i] for i in train_index]
        val_images = [train_set.images[i] for i in val_index]
        val_roles = train_roles
        data['validation'] = {'val_fraction': args.val_fraction, 'seed': args.seed,
                              'rule': 'random images of --annotations'}
        reference = (f'{len(val_images)} random images ({args.val_fraction:g}) of '
                     f'{args.annotations.name}, seed {args.seed}')
    data.update(train_images=len(train_images), val_images=len(val_images))
    return {'train': train_images, 'val': val_images, 'train_roles': train_roles,
            'val_roles': val_roles, 'reference': _split_label(reference), 'provenance': data}


def _arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The command's settings as JSON values (paths as text)."""
    return {key: str(value) if isinstance(value, Path) else value
            for key, value in vars(args).items() if key != 'run'}


def _finite_json(value: Any) -> Any:
    """``value`` with non-finite floats as None: the report stays strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    return value


def write_outputs(gp: LastLayerNTKGP, report: dict[str, Any], out: Path,
                  report_path: Path) -> None:
    """Write the report and the GP artefact, each atomically, the report last: a failure
    leaves neither file changed (or, past the GP's rename, only the GP)."""
    text = json.dumps(_finite_json(report), indent=1, allow_nan=False)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{report_path.name}.', dir=report_path.parent)
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(text + '\n')
            handle.flush()
            os.fsync(handle.fileno())
        gp.save(out)
        os.replace(tmp, report_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _summary(out: Path, report_path: Path, report: dict[str, Any]) -> str:
    from uq_perception.training.ood_baselines import format_table

    gp, model = report['gp'], report['model']
    lines = [f'wrote {out} for {model["model_id"]} ({len(model["classes"])} classes, '
             f'phi of {model["feature_dim"]}): NTK-GP {gp["gating"]} x{gp["num_experts"]}']
    for name, row in report['class_balance'].items():
        lines.append(f'  {name}: found {row["train_found"]}/{row["train_annotated"]} train, '
                     f'{row["val_found"]}/{row["val_annotated"]} val')
    lines.append(f'  OOD threshold {gp["ood_threshold"]:.4g} (GP variance quantile '
                 f'{gp["ood_quantile"]}); log evidence '
                 + ', '.join(f'{e["log_evidence"]:.1f}' for e in gp['experts']))
    lines.append(f'  feature transform {gp["feature_transform"]["kind"]} '
                 f'({gp["feature_transform"]["rule"]})')
    points = gp['training_points']
    lines.append(f'  training points {points["train_points"]}: {points["anchors_per_object"]} '
                 'per found object' + (f', {points["missed_points"]} from missed objects\' cells'
                                       if points['missed_objects'] else '')
                 + f' ({points["rule"]})')
    unknown = report['unknown']
    if unknown['auroc'] is not None:
        lines.append(f'  known-vs-unknown ({unknown["known_objects"]} known, '
                     f'{unknown["objects"]} unknown objects), the GP beside the post-hoc scores:')
        lines.append(format_table(unknown['scores']))
    else:
        lines.append('  no unknown objects annotated (--unknown): no AUROC; the uncertainty '
                     'depends on the model\'s features, so check it on objects it must not know')
    cost = report['query_cost']
    if cost['query_over_forward'] is not None:
        lines.append(f'  query cost {cost["query_ms"]:.3f} ms per image, '
                     f'{cost["query_over_forward"]:.4f} of the forward pass '
                     f'({cost["forward_ms"]:.2f} ms)')
    lines.append(f'report: {report_path}')
    return '\n'.join(lines)


def run(args: argparse.Namespace) -> int:
    """Fit, calibrate, write; bad input exits 2 with one line and writes nothing."""
    from uq_eval.gp.fitting import FitSettings, fit_detector_gp
    from uq_perception.runtime.onnx_runtime import OnnxRuntimeUnavailableError
    from uq_perception.training.train import source_commit

    report_path = args.report if args.report is not None else args.out.with_suffix('.json')
    progress = not args.no_progress
    try:
        paths = {p.resolve() for p in (args.out, report_path, args.model, args.annotations)}
        if len(paths) < 4:
            raise ValueError('--out, --report, --model and --annotations must be four '
                             'different files')
        # The settings are checked before the model loads (a selection that overlaps the
        # judging categories is refused at once).
        settings = FitSettings(score_threshold=args.score_threshold,
                               timing_images=args.timing_images, seed=args.seed,
                               feature_transform=args.feature_transform,
                               anchors_per_object=args.anchors_per_object,
                               missed_objects=args.missed_objects,
                               selection_categories=tuple(args.select_on),
                               judging_categories=tuple(args.judge_on))
        detector, model_info = open_detector(args)
        data = _load_data(args, detector.class_names, args.select_on, args.judge_on)
        print(f'{model_info["model_id"]} on {detector.backend_name} ({detector.device_name}): '
              f'{data["provenance"]["train_images"]} training and '
              f'{data["provenance"]["val_images"]} validation images', flush=True)
        gp, fitted = fit_detector_gp(
            detector, data['train'], data['train_roles'], data['val'], data['val_roles'],
            data['reference'], settings, progress=progress,
            log=(lambda line: print(line, flush=True)) if progress else (lambda line: None))
        report = {
            'out': str(args.out), 'model': model_info, 'data': data['provenance'], **fitted,
            'provenance': {'arguments': _arguments(args),
                           'created': datetime.now(timezone.utc).isoformat(timespec='seconds'),
                           'host': socket.gethostname(), 'git_commit': source_commit()},
        }
        write_outputs(gp, report, args.out, report_path)
    except (ValueError, OSError, OnnxRuntimeUnavailableError) as exc:
        print(f'uq gp fit: error: {_one_line(exc)}', file=sys.stderr)
        return 2
    print(_summary(args.out, report_path, report))
    return 0
