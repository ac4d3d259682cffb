"""``uq bench gp``: speed and memory of the NTK-GP engine against a detector forward pass.

For every combination of ``--n``, ``--dim`` and ``--experts`` a fresh worker process
(so that its peak RSS is its own) streams ``n`` synthetic ``dim``-dimensional float32
features in chunks into :meth:`LastLayerNTKGP.fit`, then times the per-detection query,
the online update and a forward pass of the project's CenterNet detector at 320x240 on
the same machine, and prints one JSON object per line:

- ``fit_seconds``: wall time of ``fit`` less the time spent generating the synthetic
  chunks (``data_seconds``, reported separately);
- ``peak_rss_mb``: peak resident memory of the worker right after the fit (interpreter,
  numpy, torch and the fit; the detector is loaded afterwards);
- ``query_us_per_item``: median of ``predict`` on one image's ``--detections`` rows
  (full output: variance, probit probabilities, entropy decomposition), per row;
- ``update_us``: median of one :meth:`LastLayerNTKGP.update`;
- ``forward_ms``: median detector forward pass on one 320x240 image;
- ``query_overhead_ratio``: per-image query time / ``forward_ms``.

The features are a mixture of Gaussian blobs, each blob one class, with a linear head of
class means, so k-means and the evidence see structured data. Torch runs with
``--threads`` threads (default 1; see ``--help``); the figures also record the torch
thread count, the CPU count and the 1-minute load average, because a CPU shared with
other processes changes them a lot.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from uq_common.arguments import positive_int

_DEFAULT_N = [2_000_000]
_DEFAULT_DIM = [128]
_DEFAULT_EXPERTS = [1, 16]
_QUICK = {'n': [20_000], 'dim': [32], 'experts': [1, 4]}


def configure(parser: argparse.ArgumentParser) -> None:
    """Benchmark the NTK-GP engine (streaming fit, query, update) against a detector forward."""
    parser.add_argument('--n', type=positive_int, action='append',
                        help=f'training rows, repeatable (default {_DEFAULT_N})')
    parser.add_argument('--dim', type=positive_int, action='append',
                        help=f'feature dimension D, repeatable (default {_DEFAULT_DIM})')
    parser.add_argument('--experts', type=positive_int, action='append',
                        help=f'number of k-means experts M, repeatable '
                             f'(default {_DEFAULT_EXPERTS})')
    parser.add_argument('--classes', type=positive_int, default=10, help='number of classes C')
    parser.add_argument('--chunk', type=positive_int, default=16384, help='rows per streamed chunk')
    parser.add_argument('--detections', type=positive_int, default=20,
                        help='detections per image for the query cost')
    parser.add_argument('--threads', type=positive_int, default=1,
                        help='torch threads in the worker, for the fit and the forward pass '
                             '(0: library default). 1 by default: on a CPU shared with other '
                             'processes (a robot running the detector) spinning OpenMP threads '
                             'can slow torch down tenfold')
    parser.add_argument('--quick', action='store_true',
                        help=f'small smoke run: {_QUICK} unless given explicitly')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run one worker process per configuration and print its JSON line."""
    defaults = _QUICK if args.quick else {'n': _DEFAULT_N, 'dim': _DEFAULT_DIM,
                                          'experts': _DEFAULT_EXPERTS}
    grid = [(n, d, m) for n in args.n or defaults['n'] for d in args.dim or defaults['dim']
            for m in args.experts or defaults['experts']]
    for n, d, m in grid:
        if min(n, d, m, args.chunk, args.detections) < 1 or args.classes < 2 or n < m \
                or args.threads < 0:
            print(f'uq bench gp: invalid configuration n={n} dim={d} experts={m} '
                  f'classes={args.classes}', file=sys.stderr)
            return 2
    status = 0
    for n, d, m in grid:
        spec = {'n': n, 'dim': d, 'experts': m, 'classes': args.classes, 'chunk': args.chunk,
                'detections': args.detections, 'threads': args.threads,
                'repeats': 50 if args.quick else 200, 'forward_repeats': 5 if args.quick else 20}
        print(f'uq bench gp: n={n} dim={d} experts={m} ...', file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, '-m', 'uq_eval.benchmarks.gp',
                               json.dumps(spec)], stdout=subprocess.PIPE, text=True,
                              check=False)
        if proc.returncode != 0:
            print(f'uq bench gp: worker failed with exit code {proc.returncode}',
                  file=sys.stderr)
            status = 1
            continue
        print(proc.stdout.strip().splitlines()[-1], flush=True)
    return status


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    import resource
    import time

    import numpy as np
    import torch
    from tqdm import tqdm

    from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig

    if spec['threads'] > 0:
        torch.set_num_threads(spec['threads'])
    n, d, m, c, chunk = spec['n'], spec['dim'], spec['experts'], spec['classes'], spec['chunk']
    rng = np.random.default_rng(0)
    blobs = 4 * c
    centres = (rng.standard_normal((blobs, d)) * 2.0).astype(np.float32)
    blob_class = np.arange(blobs) % c
    class_mean = np.stack([centres[blob_class == k].mean(0) for k in range(c)])
    weight = class_mean.astype(np.float64)
    bias = -0.5 * (weight * weight).sum(1)
    # A fixed pool of noise rows, gathered in random order, keeps data generation cheap
    # next to the fit it feeds.
    pool = rng.standard_normal((65536, d)).astype(np.float32)
    data_seconds = 0.0

    def stream() -> Any:
        nonlocal data_seconds
        made = 0
        with tqdm(total=n, unit='row', unit_scale=True, desc='fit', file=sys.stderr,
                  mininterval=1.0) as bar:
            while made < n:
                start = time.perf_counter()
                rows = min(chunk, n - made)
                which = rng.integers(blobs, size=rows)
                x = centres[which] + pool[rng.integers(len(pool), size=rows)]
                y = blob_class[which]
                data_seconds += time.perf_counter() - start
                made += rows
                bar.update(rows)
                yield x, y

    gp = LastLayerNTKGP(weight, bias, NTKGPConfig(num_experts=m))
    start = time.perf_counter()
    gp.fit(stream())
    fit_total = time.perf_counter() - start
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    k = spec['detections']
    queries = centres[rng.integers(blobs, size=k)] + pool[:k]
    logits = queries @ weight.T.astype(np.float32) + bias.astype(np.float32)
    repeats = spec['repeats']
    times = []
    for _ in range(repeats + 5):
        t0 = time.perf_counter()
        gp.predict(queries, logits)
        times.append(time.perf_counter() - t0)
    query_image_us = float(np.median(times[5:])) * 1e6
    times = []
    for i in range(repeats):
        feature = queries[i % k] + 0.1 * pool[k + i]
        t0 = time.perf_counter()
        gp.update(feature, int(i % c))
        times.append(time.perf_counter() - t0)
    update_us = float(np.median(times)) * 1e6

    from uq_perception.detectors.centernet import CenterNetDetector

    detector = CenterNetDetector([f'class_{i}' for i in range(c)], embedding_dim=d).eval()
    image = torch.rand(1, 3, 240, 320)
    times = []
    with torch.inference_mode():
        for i in range(spec['forward_repeats'] + 2):
            t0 = time.perf_counter()
            detector(image)
            if i >= 2:
                times.append(time.perf_counter() - t0)
    forward_ms = float(np.median(times)) * 1e3
    return {
        'n': n, 'dim': d, 'experts': m, 'classes': c, 'chunk_rows': chunk,
        'fit_seconds': round(fit_total - data_seconds, 3),
        'data_seconds': round(data_seconds, 3),
        'peak_rss_mb': round(peak_rss_mb, 1),
        'query_us_per_item': round(query_image_us / k, 3),
        'query_us_per_image': round(query_image_us, 1),
        'detections_per_image': k,
        'update_us': round(update_us, 1),
        'forward_ms': round(forward_ms, 3),
        'query_overhead_ratio': round(query_image_us / 1e3 / forward_ms, 6),
        'torch_threads': torch.get_num_threads(),
        'cpu_count': os.cpu_count(),
        'loadavg_1min': round(os.getloadavg()[0], 2),
        'sigma2_range': [float(gp.sigma2.min()), float(gp.sigma2.max())],
        'delta_range': [float(gp.delta.min()), float(gp.delta.max())],
    }


if __name__ == '__main__':
    print(json.dumps(_worker(json.loads(sys.argv[1]))), flush=True)
