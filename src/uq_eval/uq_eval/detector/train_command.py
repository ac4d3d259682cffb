"""``uq train``: train the detector on a simulator or COCO dataset and fit its NTK-GP.

``--data DIR`` reads the layout of ``uq sim dataset``; ``--generate-data N`` renders it
first, so one command reproduces the shipped model files from scratch. ``--coco FILE``
reads a COCO instances file instead (CVAT, Label Studio, FiftyOne, or the labels people gave
through ``uq labels export``), split at random into training and validation images. The
command lives here, not in ``uq_perception``, because rendering needs the simulator, which
the robot runtime does not depend on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from uq_common.arguments import (
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
)
from uq_perception.detectors.model_files import DETECTOR_FILE, GP_FILE
from uq_perception.training import train as training


def configure(parser: argparse.ArgumentParser) -> None:
    """Train the detector on a simulator or COCO dataset and fit its NTK-GP."""
    defaults = training.TrainConfig()
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--data', type=Path,
                        help='dataset directory with train/ and val/ (from `uq sim dataset`)')
    source.add_argument('--coco', type=Path, metavar='FILE',
                        help='COCO instances JSON (CVAT, Label Studio, FiftyOne, '
                             '`uq labels export`); every category is a class unless its '
                             'supercategory is "unknown" or "auxiliary"')
    parser.add_argument('--images', type=Path, default=None,
                        help='folder of the --coco images (default: found beside the JSON)')
    parser.add_argument('--val-fraction', type=open_fraction, default=0.2,
                        help='fraction of the --coco images held out for validation')
    parser.add_argument('--split-seed', type=non_negative_int, default=0,
                        help='seed of the --coco train/validation split')
    parser.add_argument('--input-size', type=positive_int, nargs=2, metavar=('H', 'W'),
                        default=list(defaults.input_size),
                        help='network input height and width (multiples of 16); training '
                             f'crops of {defaults.crop} are used when they fit, whole '
                             'images otherwise')
    parser.add_argument('--out', type=Path, default=Path('models'),
                        help=f'directory for {DETECTOR_FILE} and {GP_FILE}')
    parser.add_argument('--generate-data', type=positive_int, metavar='N', default=None,
                        help='first render an N-image simulator dataset into --data')
    parser.add_argument('--data-seed', type=non_negative_int, default=0,
                        help='seed of the generated dataset (with --generate-data)')
    parser.add_argument('--workers', type=positive_int, default=2,
                        help='rendering processes (with --generate-data)')
    parser.add_argument('--epochs', type=positive_int, default=defaults.epochs)
    parser.add_argument('--batch-size', type=positive_int, default=defaults.batch_size)
    parser.add_argument('--lr', type=positive_float, default=defaults.learning_rate)
    parser.add_argument('--embedding-dim', type=positive_int, default=defaults.embedding_dim)
    parser.add_argument('--outlier-weight', type=non_negative_float,
                        default=defaults.outlier_weight,
                        help='outlier exposure on auxiliary objects (0: off)')
    parser.add_argument('--separation-weight', type=non_negative_float,
                        default=defaults.separation_weight,
                        help='auxiliary-vs-known embedding separation (0: off)')
    parser.add_argument('--compactness-weight', type=non_negative_float,
                        default=defaults.compactness_weight,
                        help='pull known embeddings towards their class head row (0: off)')
    parser.add_argument('--seed', type=non_negative_int, default=defaults.seed)
    parser.add_argument('--threads', type=positive_int, default=defaults.threads,
                        help='torch CPU threads')
    parser.add_argument('--max-images', type=positive_int, default=None,
                        help='use only the first images of each split (quick runs)')
    parser.add_argument('--gp-only', action='store_true',
                        help=f'keep the trained --out/{DETECTOR_FILE}, fit only its NTK-GP')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Train (or refit the GP), print the summary; bad data or settings exit 2 with one line."""
    from uq_perception.training.detector_data import CocoTrainingData

    try:
        input_size = (args.input_size[0], args.input_size[1])
        crop = training.TrainConfig.crop
        if crop is not None and any(c > s for c, s in zip(crop, input_size, strict=True)):
            crop = None
        config = training.TrainConfig(
            epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
            embedding_dim=args.embedding_dim, outlier_weight=args.outlier_weight,
            separation_weight=args.separation_weight,
            compactness_weight=args.compactness_weight, input_size=input_size, crop=crop,
            seed=args.seed, threads=args.threads)
        if args.coco is not None:
            if args.generate_data is not None:
                raise ValueError('--generate-data renders a simulator dataset: use it with '
                                 '--data, not --coco')
            data: Path | CocoTrainingData = CocoTrainingData(
                args.coco, args.images, args.val_fraction, args.split_seed)
        elif args.images is not None:
            raise ValueError('--images names the folder of --coco images; --data has its own')
        else:
            data = args.data
        if args.gp_only:
            summary = training.refit_gp(data, args.out, seed=args.seed, threads=args.threads,
                                        progress=not args.no_progress,
                                        max_images=args.max_images)
            print(json.dumps(summary, indent=1))
            return 0
        if args.generate_data is not None:
            from uq_sim.dataset import generate_dataset

            generate_dataset(args.data, args.generate_data, seed=args.data_seed,
                             workers=args.workers, progress=not args.no_progress)
        summary = training.run_training(data, args.out, config,
                                        progress=not args.no_progress,
                                        max_images=args.max_images)
    except (ValueError, FileNotFoundError) as exc:
        print(f'uq train: error: {exc}', file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ('model_id', 'validation', 'gp',
                                              'train_seconds', 'total_seconds')}, indent=1))
    return 0
