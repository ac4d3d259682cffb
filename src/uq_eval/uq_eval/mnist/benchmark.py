"""``uq bench mnist``: uncertainty benchmark on MNIST against FashionMNIST, KMNIST, notMNIST.

Trains a small CNN (and four more for a deep ensemble) from scratch with fixed seeds and
compares max softmax, temperature scaling, MC dropout (T=10, 30), the deep ensemble, the
last-layer NTK-GP (M=1 and M>1 experts) and, where laplace-torch is installed, its last-layer
Laplace on accuracy, NLL, Brier, ECE, OOD AUROC/AUPR, misclassification AUROC and inference
cost. Writes ``results.json``, ``results.md``,
``reliability.png`` and ``histograms.png`` to ``--out``. See
:mod:`uq_eval.mnist.pipeline` for the protocol. Given several seeds or thread counts, it runs
every pair and writes the study across them (:mod:`uq_eval.mnist.seed_study`).

This module only parses arguments; torch and the pipeline are imported when the command
runs, so ``uq --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from uq_common.arguments import non_negative_int, positive_int


def configure(parser: argparse.ArgumentParser) -> None:
    """Benchmark NTK-GP uncertainty against baselines on MNIST vs FashionMNIST/KMNIST/notMNIST."""
    parser.add_argument('--data-dir', type=Path, default=None,
                        help='directory with mnist/, fashion_mnist/, kmnist/, notmnist/ '
                             '(when not given: $UQ_DATA_DIR, else <workspace>/data; '
                             '`uq data fetch all` downloads the data there)')
    parser.add_argument('--out', type=Path, default=Path('out/bench_mnist'),
                        help='output directory for results.json, results.md and plots '
                             '(default: out/bench_mnist)')
    parser.add_argument('--quick', action='store_true',
                        help='reduced run (2000 training images, 1 epoch, 500 images per '
                             'evaluation set; every method and metric)')
    parser.add_argument('--epochs', type=positive_int, default=None,
                        help='training epochs per network (default 3, --quick 1)')
    parser.add_argument('--ood', action='append', default=[], metavar='NAME=PATH',
                        help='add an unknown set NAME read from PATH to every table and plot '
                             '(repeatable): 28x28 grayscale images as an unsigned-byte IDX '
                             'file (gzipped or not) or an .npz archive (one array, or the one '
                             "named 'images'), uint8 0..255 or float in [0, 1]")
    parser.add_argument('--seeds', '--seed', dest='seeds', type=non_negative_int, nargs='+',
                        default=[0], metavar='SEED',
                        help='base random seed; several: one run per seed (and per --threads '
                             'value), each report in OUT/seed<S>-threads<T>/, and the study '
                             'across them in OUT/seed_study.md and .json (mean and worst '
                             'case)')
    parser.add_argument('--threads', type=positive_int, nargs='+', default=[1],
                        metavar='N',
                        help='torch intra-op threads (default 1, as for the figures in '
                             'docs/benchmarks.md); several: one run per value')
    parser.add_argument('--resume', action='store_true',
                        help='with several seeds or thread counts: reuse the runs already in '
                             'OUT that were made with the same settings and data')
    parser.add_argument('--no-progress', action='store_true',
                        help='no progress bars or phase messages')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and write the report; returns the exit code."""
    import dataclasses

    import torch

    from uq_eval.mnist.data import (
        OOD_SETS,
        default_data_dir,
        load_benchmark_data,
        parse_ood_argument,
        read_ood_images,
    )
    from uq_eval.mnist.laplace import LAPLACE_INSTALL_HINT, laplace_version
    from uq_eval.mnist.pipeline import IN_DISTRIBUTION, BenchmarkConfig, run_benchmark
    from uq_eval.mnist.report import results_markdown, write_report

    progress = not args.no_progress
    config = (BenchmarkConfig.quick(seed=args.seeds[0], progress=progress) if args.quick
              else BenchmarkConfig(seed=args.seeds[0], progress=progress))
    try:
        if args.epochs is not None:
            config = dataclasses.replace(config, epochs=args.epochs)
        data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
        # The extra unknown sets first: a bad one fails before the benchmark data is read.
        extra: dict[str, tuple[Path, Any]] = {}
        for argument in args.ood:
            name, path = parse_ood_argument(argument, [IN_DISTRIBUTION, *OOD_SETS, *extra])
            extra[name] = (path, read_ood_images(path))
        data = load_benchmark_data(data_dir).with_extra_ood(extra)
    except (FileNotFoundError, ValueError) as error:
        print(f'uq bench mnist: {error}', file=sys.stderr)
        return 2
    if laplace_version() is None:
        print(f'uq bench mnist: laplace-torch rows skipped (laplace is not importable); '
              f'{LAPLACE_INSTALL_HINT}', file=sys.stderr)
    if len(args.seeds) * len(args.threads) > 1:
        from uq_eval.mnist.seed_study import run_seed_study, study_markdown

        study = run_seed_study(data, config, args.seeds, args.threads, args.out, write_report,
                               torch.set_num_threads,
                               log=lambda line: print(line, file=sys.stderr, flush=True),
                               resume=args.resume)
        print(study_markdown(study['rows'], study['summary']))
        print(f"wrote {args.out / 'seed_study.md'}, {args.out / 'seed_study.json'}")
        return 0
    torch.set_num_threads(args.threads[0])
    result = run_benchmark(data, config)
    paths = write_report(result, args.out)
    print(results_markdown(result.summary))
    print('wrote ' + ', '.join(str(p) for p in paths.values()))
    return 0
