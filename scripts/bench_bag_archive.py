#!/usr/bin/env python3
"""Throughput of ``uq eval bag ARCHIVE``: serially, and on a local Ray cluster with 1 and 2
workers, in alternating rounds (so that a machine whose load drifts weighs on each alike).

    python scripts/bench_bag_archive.py ARCHIVE_DIR [--rounds 3] [--workers 1 2] \
        [--out out/bag_archive_bench] [--json FILE]

Per mode and round: the command's wall time (Ray's start, the loading of the perception and
the shutdown included) and the evaluation's (from the first bag handed out to the last row
back, every worker's perception loaded before, as the merged report gives it), frames per
second over the latter. The table gives the median of
the rounds and the overhead of each Ray run over the serial one (command time and frames/s).
Run inside the workspace environment (``source scripts/env.sh``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run_mode(archive: Path, out: Path, workers: int | None) -> dict:
    """One ``uq eval bag`` run; ``workers`` None is the serial run."""
    extra = [] if workers is None else ['--ray', '--workers', str(workers)]
    start = time.perf_counter()
    done = subprocess.run(['uq', 'eval', 'bag', str(archive), '--out', str(out),
                           '--no-progress', *extra], capture_output=True, text=True)
    command_s = time.perf_counter() - start
    if done.returncode not in (0, 2) or not (out / 'archive_report.json').is_file():
        sys.exit(f'error: uq eval bag {" ".join(extra)} failed: {done.stderr.strip()[-500:]}')
    report = json.loads((out / 'archive_report.json').read_text())
    return {'command_s': command_s, 'evaluation_s': report['wall_s'],
            'frames': report['frames'], 'frames_per_s': report['frames_per_s'],
            'bags': report['bags_evaluated']}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('archive', type=Path)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--workers', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--out', type=Path, default=Path('out/bag_archive_bench'))
    parser.add_argument('--json', type=Path, default=None)
    args = parser.parse_args()
    modes: list[tuple[str, int | None]] = [('serial', None)] + [
        (f'ray {w} worker{"s" if w > 1 else ""}', w) for w in args.workers]
    runs: dict[str, list[dict]] = {name: [] for name, _ in modes}
    for round_ in range(args.rounds):
        for name, workers in modes:
            result = run_mode(args.archive, args.out / f'{name.replace(" ", "_")}_{round_}',
                              workers)
            runs[name].append(result)
            print(f'round {round_ + 1}: {name}: {result["frames_per_s"]} frames/s, '
                  f'command {result["command_s"]:.1f} s', file=sys.stderr, flush=True)
    summary = {}
    for name, results in runs.items():
        summary[name] = {key: statistics.median(r[key] for r in results)
                         for key in ('command_s', 'evaluation_s', 'frames_per_s')}
        summary[name].update(frames=results[0]['frames'], bags=results[0]['bags'])
    serial = summary['serial']
    print('| mode | frames/s | evaluation s | command s | command over serial |')
    print('|---|---|---|---|---|')
    for name, row in summary.items():
        row['command_over_serial'] = row['command_s'] / serial['command_s']
        row['frames_per_s_over_serial'] = row['frames_per_s'] / serial['frames_per_s']
        print(f'| {name} | {row["frames_per_s"]:.1f} | {row["evaluation_s"]:.1f} | '
              f'{row["command_s"]:.1f} | {row["command_over_serial"]:.2f}x |')
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({'rounds': args.rounds, 'modes': summary,
                                         'runs': runs}, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
