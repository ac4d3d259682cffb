"""``uq build-engine``: compile the detector network into a TensorRT engine.

The engine holds the network only; the NTK-GP query runs on the host.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    """Build a TensorRT engine (FP16) of the detector network on this machine's NVIDIA GPU."""
    from uq_perception.detectors.model_files import default_detector_path

    parser.add_argument('--model', default=str(default_detector_path()),
                        help='detector weights')
    parser.add_argument('--out', default='build/detector_trt.ep',
                        help='engine file to write (built artefact: never commit it)')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.runtime.backends import BackendUnavailableError, build_tensorrt_engine

    try:
        path = build_tensorrt_engine(load_detector(args.model), args.out)
    except (BackendUnavailableError, ValueError) as exc:
        print(f'uq build-engine: {exc}', file=sys.stderr)
        return 2
    print(f'wrote TensorRT engine {path}; run the node with '
          f'-p backend:=tensorrt -p engine_path:={path}')
    return 0
