"""``uq bench backend``: every inference backend this machine runs, side by side in one run,
at the model input and at camera frame sizes, with and without the GP query.

Variants (each skipped, with its reason in the JSON, where the machine cannot run it):

- ``pytorch-cpu``: eager FP32 on the CPU, the baseline of the CPU rows;
- ``onnxruntime``: the ONNX export on ONNX Runtime's CPU provider;
- with CUDA: ``pytorch-cuda`` eager FP32 (the baseline of the GPU rows), then CUDA graphs
  with preprocessing on the GPU in FP32 and in FP16 (``uq_perception.runtime.cuda_graph``);
- ``tensorrt`` when ``--engine`` names an engine built by ``uq build-engine``.

Frames are the rendered tabletop scene of ``uq bench node`` scaled to each size. For every
size each run takes the next frame and hands it to every variant in turn (the order rotates
from run to run, so no variant always runs first), twice: the backend's ``infer`` alone
(``no GP``: preprocess, network, download, decode) and the perception pipeline of the node
(``with GP``: the same plus the NTK-GP query of the kept detections and their box standard
deviations). A call is timed from its start until its results are on the host; GPU
variants synchronise inside it. The CUDA-graph variants compute the GP variance of every
candidate inside the graph in both columns. ``x eager`` is the speed-up over the eager FP32
baseline of the same device type, same frame size and column: its p50 over the row's p50.

The JSON (last line of stdout, and ``--json``) names the device, the CPU, the torch, CUDA,
cuDNN and ONNX Runtime versions, the threads and the load average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_common.arguments import non_negative_int, positive_int

if TYPE_CHECKING:
    from uq_perception.perception import UncertaintyPerception
    from uq_perception.runtime.backends import InferenceBackend

#: Camera frame sizes timed besides the model input (width, height).
CAMERA_SIZES = ((640, 480), (1280, 720), (1920, 1080))
#: Largest frame side accepted by ``--size``.
MAX_SIDE = 8192
CPU_BASELINE = 'pytorch-cpu'
GPU_BASELINE = 'pytorch-cuda eager fp32'


def frame_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (e.g. ``640x480``) as ``(width, height)``, each 1..8192."""
    parts = text.lower().split('x')
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f'a frame size is WIDTHxHEIGHT, e.g. 640x480: {text!r}')
    width, height = (int(p) for p in parts)
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise argparse.ArgumentTypeError(f'frame sides must lie in 1..{MAX_SIDE}: {text!r}')
    return width, height


def configure(parser: argparse.ArgumentParser) -> None:
    """Time every backend of this machine at the model input and camera sizes, GP or not."""
    from uq_perception.detectors.model_files import default_detector_path, default_gp_path

    parser.add_argument('--model', default=str(default_detector_path()),
                        help='detector weights')
    parser.add_argument('--gp', default=str(default_gp_path()), help='NTK-GP artefact')
    parser.add_argument('--runs', type=positive_int, default=300,
                        help='timed frames per size and variant')
    parser.add_argument('--warmup', type=non_negative_int, default=20,
                        help='untimed frames per size and variant first (lazy initialisation, '
                             'graph capture)')
    parser.add_argument('--threads', type=positive_int, default=1,
                        help='CPU threads of torch and ONNX Runtime')
    parser.add_argument('--size', type=frame_size, action='append',
                        help='camera frame size WIDTHxHEIGHT, repeatable (default: the model '
                             'input, ' + ', '.join(f'{w}x{h}' for w, h in CAMERA_SIZES) + ')')
    parser.add_argument('--engine', default='',
                        help='TensorRT engine from `uq build-engine`: adds a tensorrt row')
    parser.add_argument('--json', type=Path, help='also write the JSON report to this file')
    parser.set_defaults(run=run)


@dataclass
class Variant:
    """One way of running the detector, its pipeline and its timings."""

    label: str
    baseline: str
    backend: InferenceBackend
    pipeline: UncertaintyPerception
    times_ms: dict[str, list[float]] = field(default_factory=lambda: {'no_gp': [],
                                                                      'with_gp': []})


def _factories(model_path: str, threads: int, engine: str, gp: Any
               ) -> list[tuple[str, str, Callable[[], InferenceBackend]]]:
    """(label, baseline label, factory) of every variant worth trying on this machine."""
    import torch

    from uq_perception.detectors.centernet import load_detector
    from uq_perception.runtime.backends import BackendKind, create_backend

    def make(kind: str, **options: Any) -> Callable[[], InferenceBackend]:
        # A fresh model each: backends move their model to their device.
        return lambda: create_backend(kind, load_detector(model_path), **options)

    variants = [(CPU_BASELINE, CPU_BASELINE, make('pytorch-cpu'))]
    if 'onnxruntime' in {k.value for k in BackendKind}:
        variants.append(('onnxruntime', CPU_BASELINE,
                         make('onnxruntime', onnx_threads=threads, gp=gp)))
    if torch.cuda.is_available():
        from uq_perception.runtime.cuda_graph import CudaOptions, Precision

        variants.append((GPU_BASELINE, GPU_BASELINE, make('pytorch-cuda')))
        for precision in Precision:
            options = CudaOptions(cuda_graph=True, precision=precision, gpu_preprocess=True)
            variants.append((f'pytorch-cuda {options.describe()}', GPU_BASELINE,
                             make('pytorch-cuda', gp=gp, cuda=options)))
    if engine:
        variants.append(('tensorrt fp16', GPU_BASELINE,
                         make('tensorrt', engine_path=engine)))
    return variants


def _build(model_path: str, gp: Any, threads: int, engine: str
           ) -> tuple[list[Variant], dict[str, str]]:
    from uq_perception.perception import UncertaintyPerception

    variants, skipped = [], {}
    for label, baseline, factory in _factories(model_path, threads, engine, gp):
        print(f'[bench backend] preparing {label} ...', file=sys.stderr, flush=True)
        try:
            backend = factory()
        except Exception as exc:  # noqa: BLE001 - any backend this machine cannot run
            skipped[label] = f'{type(exc).__name__}: {" ".join(str(exc).split())}'
            continue
        variants.append(Variant(label, baseline, backend, UncertaintyPerception(backend, gp)))
    return variants, skipped


def _time_size(variants: list[Variant], frames: list[np.ndarray], runs: int,
               warmup: int) -> None:
    for variant in variants:
        variant.times_ms = {'no_gp': [], 'with_gp': []}
    for index in range(warmup + runs):
        frame = frames[index % len(frames)]
        shift = index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            backend, pipeline = variant.backend, variant.pipeline
            start = time.perf_counter()
            backend.infer(frame, pipeline.score_threshold, pipeline.max_detections)
            backend.synchronize()
            middle = time.perf_counter()
            pipeline.process(frame)
            backend.synchronize()
            end = time.perf_counter()
            if index >= warmup:
                variant.times_ms['no_gp'].append((middle - start) * 1e3)
                variant.times_ms['with_gp'].append((end - middle) * 1e3)


def summarise(variants: list[Variant], size: tuple[int, int]) -> list[dict[str, Any]]:
    """One row per variant: p50/p99 per column and the speed-up over its baseline's p50."""
    p50 = {v.label: {c: float(np.percentile(t, 50)) for c, t in v.times_ms.items()}
           for v in variants}
    rows = []
    for variant in variants:
        row: dict[str, Any] = {'variant': variant.label, 'backend': variant.backend.backend_name,
                               'device': variant.backend.device_name,
                               'frame': f'{size[0]}x{size[1]}', 'baseline': variant.baseline}
        for column, times in variant.times_ms.items():
            base = p50.get(variant.baseline, {}).get(column)
            row[column] = {
                'p50_ms': round(p50[variant.label][column], 3),
                'p99_ms': round(float(np.percentile(times, 99)), 3),
                'speedup_over_baseline_p50': None if base is None
                else round(base / p50[variant.label][column], 3),
            }
        graph_failure = getattr(variant.backend, 'graph_failure', None)
        if graph_failure is not None:
            row['graph_failure'] = graph_failure
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (p50 / p99 ms, speed-up over the eager FP32 baseline)."""
    lines = ['| variant | frame | no GP p50 / p99 ms | x eager | with GP p50 / p99 ms | x eager |',
             '|---|---|---|---|---|---|']
    for row in rows:
        cells = [row['variant'], row['frame']]
        for column in ('no_gp', 'with_gp'):
            figures = row[column]
            cells.append(f'{figures["p50_ms"]:.2f} / {figures["p99_ms"]:.2f}')
            speedup = figures['speedup_over_baseline_p50']
            cells.append('-' if speedup is None else f'{speedup:.2f}')
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def _environment(threads: int, variants: list[Variant]) -> dict[str, Any]:
    import torch

    from uq_eval.detector.evaluation import _cpu_name

    env: dict[str, Any] = {
        'cpu': _cpu_name(), 'cpu_count': os.cpu_count(), 'threads': threads,
        'python': platform.python_version(), 'torch': torch.__version__,
        'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version()
        if torch.cuda.is_available() else None,
        'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        'devices': sorted({v.backend.device_name for v in variants}),
    }
    try:
        # The installed version, without importing the runtime (the backends import it).
        env['onnxruntime'] = metadata.version('onnxruntime')
    except metadata.PackageNotFoundError:
        env['onnxruntime'] = None
    return env


def run(args: argparse.Namespace) -> int:
    import torch

    from uq_eval.benchmarks.node import _frames
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.ntk import LastLayerNTKGP

    for path in (args.model, args.gp):
        if not Path(path).is_file():
            print(f'uq bench backend: {path} not found', file=sys.stderr)
            return 2
    if args.engine and not Path(args.engine).is_file():
        print(f'uq bench backend: engine {args.engine} not found', file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    try:
        model = load_detector(args.model)
        gp = LastLayerNTKGP.load(args.gp, feature_dim=model.embedding_dim,
                                 model_id=model.model_id or None)
    except ValueError as exc:
        print(f'uq bench backend: {exc}', file=sys.stderr)
        return 2
    height, width = model.input_size
    sizes = args.size or [(width, height), *CAMERA_SIZES]
    variants, skipped = _build(args.model, gp, args.threads, args.engine)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        print(f'[bench backend] {size[0]}x{size[1]}: {len(variants)} variants, '
              f'{args.warmup} + {args.runs} frames each ...', file=sys.stderr, flush=True)
        frames = _frames(min(args.runs, 30), size[1], size[0])
        _time_size(variants, frames, args.runs, args.warmup)
        rows += summarise(variants, size)
    report = {
        'model': str(args.model), 'gp': str(args.gp), 'engine': args.engine or None,
        'model_input': f'{width}x{height}', 'runs': args.runs, 'warmup': args.warmup,
        'environment': _environment(args.threads, variants),
        'load_average_start': [round(v, 2) for v in load_start],
        'load_average_end': [round(v, 2) for v in os.getloadavg()],
        'skipped': skipped, 'rows': rows,
    }
    print(markdown_table(rows))
    for label, reason in skipped.items():
        print(f'skipped {label}: {reason}')
    text = json.dumps(report)
    print(text, flush=True)
    if args.json:
        args.json.write_text(text + '\n')
    return 0
