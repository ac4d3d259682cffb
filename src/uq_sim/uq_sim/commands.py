"""``uq`` subcommands of the simulator (``uq sim dataset``, ``uq sim preview``, ``uq bench sim``).

Kept cheap to import: MuJoCo, OpenCV and the renderer load inside the ``run`` functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from uq_common.arguments import non_negative_int, positive_int


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f'must be in [0, 1], got {value}')
    return value


def configure_dataset(parser: argparse.ArgumentParser) -> None:
    """Render a synthetic COCO detection dataset (train/val/test known, test_unknown)."""
    parser.add_argument('--out', required=True, type=Path, help='output directory')
    parser.add_argument('--n', required=True, type=positive_int,
                        help='total number of images over all splits')
    parser.add_argument('--seed', type=non_negative_int, default=0, help='dataset seed')
    parser.add_argument('--width', type=positive_int, default=320, help='image width, px')
    parser.add_argument('--height', type=positive_int, default=240, help='image height, px')
    parser.add_argument('--val-fraction', type=_fraction, default=0.1,
                        help='fraction of images in the val split')
    parser.add_argument('--test-fraction', type=_fraction, default=0.1,
                        help='fraction of images in the test split (known objects)')
    parser.add_argument('--unknown-fraction', type=_fraction, default=0.1,
                        help='fraction of images in the test_unknown split (known and '
                             'unknown objects); train gets the rest')
    parser.add_argument('--splits', nargs='+', default=None,
                        choices=['train', 'val', 'test', 'test_unknown'],
                        help='generate only these splits (ids stay those of the full set)')
    parser.add_argument('--workers', type=positive_int, default=1,
                        help='rendering processes (output does not depend on it)')
    parser.add_argument('--no-progress', action='store_true', help='hide the progress bar')
    parser.set_defaults(run=run_dataset)


def run_dataset(args: argparse.Namespace) -> int:
    """Generate the dataset described by ``args``; prints the split directories."""
    import time

    from uq_sim.dataset import generate_dataset

    train = 1.0 - args.val_fraction - args.test_fraction - args.unknown_fraction
    if train < -1e-9:
        print('error: val, test and unknown fractions sum to more than 1', file=sys.stderr)
        return 2
    fractions = {'train': max(0.0, train), 'val': args.val_fraction,
                 'test': args.test_fraction, 'test_unknown': args.unknown_fraction}
    start = time.perf_counter()
    try:
        paths = generate_dataset(args.out, args.n, args.seed, args.width, args.height,
                                 fractions=fractions, splits=args.splits,
                                 workers=args.workers, progress=not args.no_progress)
    except ValueError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    for split, path in paths.items():
        print(f'{split}: {path}')
    print(f'rendered in {elapsed:.1f} s', file=sys.stderr)
    return 0


def configure_preview(parser: argparse.ArgumentParser) -> None:
    """Render a contact sheet of random scenes with their ground-truth boxes to a PNG."""
    parser.add_argument('--out', type=Path, default=Path('out/sim_preview.png'),
                        help='output PNG')
    parser.add_argument('--n', type=positive_int, default=12, help='number of scenes')
    parser.add_argument('--seed', type=non_negative_int, default=0, help='seed')
    parser.add_argument('--split', default='test_unknown',
                        choices=['train', 'val', 'test', 'test_unknown'],
                        help='which split\'s randomisation to use')
    parser.set_defaults(run=run_preview)


def run_preview(args: argparse.Namespace) -> int:
    """Render ``args.n`` scenes and tile them with boxes drawn."""
    import cv2
    import numpy as np

    from uq_sim.dataset import render_example
    from uq_sim.objects import ALL_CLASSES
    from uq_sim.scene import SceneRenderer

    tiles = []
    with SceneRenderer(320, 240) as renderer:
        for i in range(args.n):
            rgb, anns = render_example(renderer, args.seed, i + 1, args.split)
            img = np.ascontiguousarray(rgb[..., ::-1])
            for a in anns:
                x, y, w, h = a['bbox']
                colour = (0, 0, 255) if a['occluded'] else (0, 220, 0)
                cv2.rectangle(img, (x, y), (x + w - 1, y + h - 1), colour, 1)
                cv2.putText(img, ALL_CLASSES[a['category_id'] - 1], (x, max(9, y - 2)),
                            cv2.FONT_HERSHEY_PLAIN, 0.8, colour, 1)
            tiles.append(img)
    while len(tiles) % 4:
        tiles.append(np.zeros_like(tiles[0]))
    sheet = np.vstack([np.hstack(tiles[i:i + 4]) for i in range(0, len(tiles), 4)])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(args.out), sheet)
    print(args.out)
    return 0


def configure_bench(parser: argparse.ArgumentParser) -> None:
    """Measure the simulator's rendering rate (images/s) and print JSON."""
    parser.add_argument('--n', type=positive_int, default=50, help='images to render')
    parser.add_argument('--width', type=positive_int, default=320, help='image width, px')
    parser.add_argument('--height', type=positive_int, default=240, help='image height, px')
    parser.add_argument('--seed', type=non_negative_int, default=0, help='seed')
    parser.set_defaults(run=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    """Time dataset images (new random scene each) and a fixed scene (camera-node path)."""
    from uq_sim.benchmark import benchmark_rendering

    print(json.dumps(benchmark_rendering(args.n, args.width, args.height, args.seed), indent=2))
    return 0
