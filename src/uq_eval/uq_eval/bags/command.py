"""``uq eval bag``: evaluate a recorded rosbag2 bag offline, or an archive of many bags
(see docs/bag_evaluation.md).

One bag: exit status 0 when the whole bag was evaluated, 2 when the bag is unusable
(nothing evaluated, a one-line message names the bag and the problem) or had problems
(truncated, skipped messages, out-of-order stamps: the report covers what could be read and
lists them).

An archive (a folder of bag folders, or a file listing them; ``--ray`` also takes a single
bag): every bag is evaluated (:mod:`uq_eval.bags.archive`), serially in this process, or in
parallel on Ray with ``--ray``; a merged report goes to ``--out``. Exit status 0 when every
bag was evaluated without problems, 2 when one failed or had problems (its row says which),
or when the archive cannot be listed, or ``--ray`` is asked for without Ray installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from uq_common.arguments import positive_int


def configure(parser: argparse.ArgumentParser) -> None:
    """Evaluate a bag: perception, autonomy levels and help requests, with metrics and plots."""
    parser.add_argument('bag', type=Path, metavar='BAG|ARCHIVE_DIR_OR_LIST',
                        help='rosbag2 bag directory (MCAP or sqlite3), or an archive: a '
                             'folder of bag directories or a file listing them, one a line')
    parser.add_argument('--ground-truth', default=None, metavar='FILE|TOPIC',
                        help='ground truth: a COCO annotations file with frame stamps '
                             '(taken as a file when it exists or ends in .json: '
                             '<bag>/ground_truth.json of `uq sim record`, or the '
                             'annotations of `uq labels export`, partial labels, no AP), '
                             'else a uq_msgs/DetectionArray topic of the bag (default: the '
                             'ground_truth topic when the bag has it)')
    parser.add_argument('--image-topic', default=None,
                        help='Image or CompressedImage topic (default: the only one)')
    parser.add_argument('--arbitration-params', type=Path, default=None, metavar='YAML',
                        help='arbitration node parameters file (e.g. config/arbitration.yaml '
                             'with calibrated thresholds); default: the node defaults')
    parser.add_argument('--out', type=Path, default=Path('out/bag_eval'),
                        help='report directory')
    parser.add_argument('--bench', action='store_true',
                        help='also time the replay against the bare forward pass on the '
                             'same frames (alternating rounds, see --bench-rounds and '
                             '--bench-frames) and measure peak memory for 1x and 10x the bag')
    # Defaults None: the figures live in uq_eval.bags.evaluation, which this parser does
    # not import (numpy and the detector's modules would load for every `uq` command).
    parser.add_argument('--bench-frames', type=positive_int, default=None, metavar='N',
                        help='with --bench: frames each side of a round times, at least, '
                             'in whole passes of the bag (default: 300; fewer for a quick '
                             'check of the figures, not for a measurement)%(default).0s')
    parser.add_argument('--bench-rounds', type=positive_int, default=None, metavar='N',
                        help='with --bench: alternating rounds (default: 3)%(default).0s')
    parser.add_argument('--repeat', type=positive_int, default=1, help=argparse.SUPPRESS)
    parser.add_argument('--no-report', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--no-progress', action='store_true', help='hide the progress bar')
    parser.add_argument('--ray', action='store_true',
                        help='evaluate the bags in parallel on Ray: one task per bag, the '
                             'perception loaded once per worker (needs the optional extra '
                             'requirements/ray.in)')
    parser.add_argument('--address', default=None,
                        help='with --ray: join this Ray cluster (e.g. ray://head:10001 or '
                             'auto) instead of starting a local one%(default).0s')
    parser.add_argument('--workers', type=positive_int, default=None,
                        help='with --ray: workers (Ray actors), each with its own perception '
                             '(default: this machine\'s CPUs)%(default).0s')
    parser.set_defaults(run=run)


def _peak_rss_mib(bag: Path, repeat: int) -> float:
    """Peak RSS of a child process evaluating the bag ``repeat`` times, MiB."""
    child = subprocess.Popen([sys.executable, '-m', 'uq_common.cli', 'eval', 'bag', str(bag),
                              '--repeat', str(repeat), '--no-report', '--no-progress'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # wait4 gives this child's own peak; RUSAGE_CHILDREN would be the largest child the
    # process ever had (an earlier, bigger one would hide this one).
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024.0


def run(args: argparse.Namespace) -> int:
    """Evaluate ``args.bag`` (one bag or an archive) and write the report; see the module
    docstring for exit codes."""
    from uq_eval.bags.archive import is_archive

    if getattr(args, 'ray', False) or is_archive(args.bag):
        return run_archive(args)
    return run_one(args)


def run_archive(args: argparse.Namespace) -> int:
    """Evaluate every bag of an archive, serially or on Ray, and write the merged report."""
    from uq_eval.bags.archive import (
        ArchiveError,
        BagSettings,
        RayRunner,
        SerialRunner,
        evaluate_archive,
        find_bags,
        report_markdown,
    )
    from uq_eval.bags.evaluation import load_shipped_perception
    from uq_eval.bags.ground_truth import is_ground_truth_file

    if args.bench or (args.ground_truth is not None
                      and is_ground_truth_file(args.ground_truth)):
        print('error: an archive takes neither --bench nor a ground-truth file (each bag '
              'uses its ground_truth topic, or the topic --ground-truth names)',
              file=sys.stderr)
        return 2
    try:
        bags = find_bags(args.bag)
    except ArchiveError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    try:
        arbitration_values = _arbitration_values(args)
    except (OSError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    settings = BagSettings(args.image_topic, args.ground_truth, arbitration_values)
    if args.ray:
        try:
            runner: Any = RayRunner(args.workers or os.cpu_count() or 1, args.address)
        except (ImportError, RuntimeError) as err:
            print(f'error: {err}', file=sys.stderr)
            return 2
    else:
        runner = SerialRunner(load_shipped_perception)
    try:
        report = evaluate_archive(bags, runner, settings, progress=not args.no_progress)
    finally:
        runner.close()
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = report_markdown(report)
    (out_dir / 'archive_report.md').write_text(markdown, encoding='utf-8')
    (out_dir / 'archive_report.json').write_text(json.dumps(report, indent=1) + '\n',
                                                 encoding='utf-8')
    print(markdown)
    print(f'report: {out_dir / "archive_report.md"}', file=sys.stderr)
    failed = [row for row in report['rows'] if row['error'] or row['problems']]
    for row in failed:
        print(f'warning: {row["error"] or "; ".join(row["problems"])}', file=sys.stderr)
    return 2 if failed else 0


def _arbitration_values(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``--arbitration-params`` file's values, or None; OSError and ValueError name the
    file."""
    if args.arbitration_params is None:
        return None
    from uq_autonomy.arbitration.params import load_parameters_file

    return load_parameters_file(args.arbitration_params)


def run_one(args: argparse.Namespace) -> int:
    """Evaluate the one bag ``args.bag`` and write its report."""
    from uq_eval.bags.evaluation import (
        BENCH_MIN_FRAMES,
        BENCH_ROUNDS,
        BagEvaluator,
        bench_replay_against_forward,
        load_shipped_perception,
        run_evaluation,
    )
    from uq_eval.bags.ground_truth import (
        GroundTruthError,
        is_ground_truth_file,
        load_coco_ground_truth,
    )
    from uq_eval.bags.reader import BagError, BagStream

    ground_truth = None
    truth_topic = args.ground_truth
    if args.ground_truth is not None and is_ground_truth_file(args.ground_truth):
        truth_topic = None
        try:
            ground_truth = load_coco_ground_truth(args.ground_truth)
        except GroundTruthError as err:
            print(f'error: {err}', file=sys.stderr)
            return 2
    try:
        stream = BagStream(args.bag, args.image_topic, truth_topic,
                           topic_ground_truth=ground_truth is None)
    except BagError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    if stream.image_topic is None:
        print(f'error: bag {args.bag}: no image topic to evaluate offline', file=sys.stderr)
        return 2
    try:
        arbitration_values = _arbitration_values(args)
    except (OSError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    perception = load_shipped_perception()
    out_dir: Path = args.out
    if not args.no_report:
        out_dir.mkdir(parents=True, exist_ok=True)
    evaluator = BagEvaluator(perception, None if args.no_report else out_dir / 'crops',
                             str(args.bag), arbitration_values, ground_truth)
    data = run_evaluation(stream, evaluator, progress=not args.no_progress,
                          repeat=max(1, args.repeat))
    extra: dict = {}
    if args.bench and data.frames:
        min_frames = args.bench_frames or BENCH_MIN_FRAMES
        rounds = args.bench_rounds or BENCH_ROUNDS
        print(f'benchmark: replay against the bare forward pass, {rounds} rounds of '
              f'at least {min_frames} frames each, then peak memory', file=sys.stderr)
        extra['bench'] = bench_replay_against_forward(
            stream, lambda: BagEvaluator(perception, None, str(args.bag), arbitration_values,
                                         ground_truth),
            min_frames=min_frames, rounds=rounds)
        extra['bench'].update(peak_rss_mib_1x=_peak_rss_mib(args.bag, 1),
                              peak_rss_mib_10x=_peak_rss_mib(args.bag, 10))
        print(json.dumps(extra['bench'], indent=2))
    stream.close()
    if not data.frames:
        print(f'error: bag {args.bag}: no image could be evaluated'
              + (f' ({"; ".join(data.problems)})' if data.problems else ''), file=sys.stderr)
        return 2
    if not args.no_report:
        from uq_eval.bags.report import compute_metrics, write_plots, write_report

        metrics = compute_metrics(data)
        plots = write_plots(data, out_dir)
        md, _ = write_report(args.bag, data, metrics, plots, out_dir, extra)
        print(md)
    for problem in data.problems:
        print(f'warning: {problem}', file=sys.stderr)
    return 2 if data.problems else 0
