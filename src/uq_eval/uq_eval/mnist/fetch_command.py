"""``uq data fetch``: download the datasets of ``uq bench mnist`` into the data directory.

Arguments only; the downloads and checks are :mod:`uq_eval.mnist.fetch`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from uq_common.arguments import positive_float, positive_int


def configure(parser: argparse.ArgumentParser) -> None:
    """Download MNIST, FashionMNIST, KMNIST and notMNIST, each file checked by its SHA-256."""
    parser.add_argument('datasets', nargs='*', default=['all'], metavar='DATASET',
                        help='mnist, fashion_mnist, kmnist, notmnist or all')
    parser.add_argument('--data-dir', type=Path, default=None,
                        help='destination, one folder per dataset (when not given: '
                             '$UQ_DATA_DIR, else <workspace>/data)')
    parser.add_argument('--mirror', action='append', default=[], metavar='[NAME=]URL',
                        help='download from URL/<dataset>/ instead of the publishers '
                             '(a mirror laid out like the data directory), or NAME=URL: '
                             'dataset NAME from the base URL URL; repeatable; without it '
                             'the environment variable UQ_DATA_MIRROR is read the same way')
    parser.add_argument('--tries', type=positive_int, default=3,
                        help='attempts per file while transfers are cut off; each resumes '
                             'from the bytes already received')
    parser.add_argument('--timeout', type=positive_float, default=60.0, metavar='SECONDS',
                        help='network timeout of each connection and read')
    parser.add_argument('--no-progress', action='store_true', help='no progress bars')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Fetch the datasets named; returns the exit code (0, 1 failed download, 2 bad usage)."""
    from uq_eval.mnist.data import configured_data_dir
    from uq_eval.mnist.fetch import (
        DATASETS,
        MIRROR_ENV,
        FetchError,
        fetch_dataset,
        parse_mirrors,
        resolve_names,
    )

    def log(line: str) -> None:
        print(line, flush=True)

    try:
        names = resolve_names(args.datasets)
        mirrors = args.mirror or ([os.environ[MIRROR_ENV]] if os.environ.get(MIRROR_ENV)
                                  else [])
        sources = parse_mirrors(mirrors)
    except ValueError as error:
        print(f'uq data fetch: {error}', file=sys.stderr)
        return 2
    if args.data_dir is not None:
        root, origin = args.data_dir, '--data-dir'
    else:
        root, origin = configured_data_dir()
    log(f'data directory: {root} ({origin})')
    try:
        for name in names:
            fetch_dataset(root, DATASETS[name], sources, tries=args.tries,
                          timeout_s=args.timeout, progress=not args.no_progress, log=log)
    except FetchError as error:
        print(f'uq data fetch: {error}', file=sys.stderr)
        return 1
    except OSError as error:
        print(f'uq data fetch: cannot write {error.filename or root}: '
              f'{error.strerror or error}', file=sys.stderr)
        return 1
    log(f'done: {", ".join(names)} in {root}')
    return 0
