"""``uq train``: train the detector on a simulator dataset and fit its NTK-GP.

``--generate-data N`` renders the simulator dataset first, so one command reproduces the
shipped model files from scratch. The command lives here, not in ``uq_perception``,
because rendering needs the simulator, which the robot runtime does not depend on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from uq_common.arguments import non_negative_float, non_negative_int, positive_float, positive_int
from uq_perception import training
from uq_perception.model_files import DETECTOR_FILE, GP_FILE


def configure(parser: argparse.ArgumentParser) -> None:
    """Train the detector on a simulator dataset and fit its NTK-GP."""
    defaults = training.TrainConfig()
    parser.add_argument('--data', type=Path, required=True,
                        help='dataset directory with train/ and val/ (from `uq sim dataset`)')
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
    config = training.TrainConfig(epochs=args.epochs, batch_size=args.batch_size,
                         learning_rate=args.lr, embedding_dim=args.embedding_dim,
                         outlier_weight=args.outlier_weight,
                         separation_weight=args.separation_weight,
                         compactness_weight=args.compactness_weight,
                         seed=args.seed, threads=args.threads)
    if args.gp_only:
        summary = training.refit_gp(args.data, args.out, seed=args.seed, threads=args.threads,
                           progress=not args.no_progress, max_images=args.max_images)
        print(json.dumps(summary, indent=1))
        return 0
    if args.generate_data is not None:
        from uq_sim.dataset import generate_dataset

        generate_dataset(args.data, args.generate_data, seed=args.data_seed,
                         workers=args.workers, progress=not args.no_progress)
    summary = training.run_training(args.data, args.out, config, progress=not args.no_progress,
                           max_images=args.max_images)
    print(json.dumps({k: summary[k] for k in ('model_id', 'validation', 'gp',
                                              'train_seconds', 'total_seconds')}, indent=1))
    return 0
