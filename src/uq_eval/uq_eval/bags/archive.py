"""Many bags at once: ``uq eval bag ARCHIVE_DIR_OR_LIST [--ray]`` (ROS-free core).

An archive is a folder of bags (each sub-folder is one bag folder, MCAP or sqlite3, as
``uq sim record`` and ``ros2 bag record`` write them) or a text file listing bag folders, one a
line (``#`` starts a comment; relative paths are
taken from the file's folder). Each bag is evaluated as ``uq eval bag`` evaluates one
(:class:`~uq_eval.bags.evaluation.BagEvaluator`, no crops, no plots) and yields one row;
a bag that cannot be read (corrupt, truncated, no images) yields a row with the error and
the run goes on.

Runners
    :class:`SerialRunner` loads the perception once and evaluates the bags one after the
    other in this process. :class:`RayRunner` starts (or joins, ``address``) a Ray cluster
    and creates ``workers`` actors, each of which loads the perception once; every bag is
    one task (a call on a free actor). Both run :func:`evaluate_bag`, so their rows and
    pooled metrics agree; only the timings differ. Ray is imported only by
    :class:`RayRunner` (``requirements/ray.in``).

Merged report (:func:`merge_report`)
    Per-bag rows; metrics pooled over the detections of every evaluated bag
    (:func:`uq_eval.bags.report.compute_metrics` on the bags' data put together) with 95 %
    bootstrap confidence intervals that resample whole bags (frames of one bag are not
    independent); the slowest bags (frames per second) and the worst (lowest AP@0.5, then
    highest ECE).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

# Pooled metrics with bootstrap intervals (higher is better unless noted in the report).
CI_METRICS = ('map50', 'ece', 'accuracy_matched', 'misclassification_auroc', 'aurc',
              'ood_auroc')
BOOTSTRAP_RESAMPLES = 200
BOOTSTRAP_SEED = 0
RAY_INSTALL = ("ray is not installed: install the optional extra with "
               "pip install -c requirements/constraints.txt -r requirements/ray.in")


class ArchiveError(ValueError):
    """The archive cannot be listed (missing, empty, an unreadable list)."""


def is_bag(path: Path) -> bool:
    """A rosbag2 bag folder (it has ``metadata.yaml``)."""
    return path.is_dir() and (path / 'metadata.yaml').is_file()


def is_archive(path: Path) -> bool:
    """Whether ``path`` names an archive rather than one bag: a file that is not a bag file
    (a list), or a folder of folders that holds no bag files of its own (a bag folder
    without its ``metadata.yaml`` is still one bag, reported as such)."""
    if path.is_file():
        return path.suffix not in ('.mcap', '.db3', '.yaml')
    if not path.is_dir() or is_bag(path):
        return False
    children = list(path.iterdir())
    if any(c.is_file() and c.suffix in ('.mcap', '.db3') for c in children):
        return False
    return any(c.is_dir() for c in children)


def find_bags(source: str | os.PathLike[str]) -> list[Path]:
    """The bags of an archive folder or list file, in a stable order.

    Raises
    ------
    ArchiveError
        When ``source`` does not exist, lists no bag, or cannot be read.
    """
    root = Path(source)
    if root.is_dir():
        if is_bag(root):
            return [root]
        bags = sorted(p for p in root.iterdir() if p.is_dir())
    elif root.is_file():
        try:
            lines = root.read_text(encoding='utf-8').splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ArchiveError(f'bag list {root} cannot be read: {err}') from err
        entries = [line.split('#', 1)[0].strip() for line in lines]
        bags = [p if p.is_absolute() else root.parent / p
                for p in (Path(e).expanduser() for e in entries if e)]
    else:
        raise ArchiveError(f'{root} does not exist (expected a folder of bags or a file '
                           f'listing them)')
    if not bags:
        raise ArchiveError(f'{root} holds no bag (no sub-folder, no listed path)')
    return bags


@dataclass(frozen=True)
class BagSettings:
    """What every bag of an archive is evaluated with."""

    image_topic: str | None = None
    ground_truth_topic: str | None = None
    arbitration_values: dict | None = None


@dataclass
class BagRow:
    """One bag's line of the merged report; ``error`` is set when it could not be
    evaluated."""

    bag: str
    frames: int = 0
    detections: int = 0
    seconds: float = 0.0
    frames_per_s: float = 0.0
    map50: float | None = None
    ece: float | None = None
    ood_auroc: float | None = None
    misclassification_auroc: float | None = None
    help_requests: int = 0
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    worker: str = ''


def evaluate_bag(path: Path, perception: Any, settings: BagSettings,
                 worker: str = '') -> tuple[BagRow, Any]:
    """Evaluate one bag with a loaded perception: its row, and its
    :class:`~uq_eval.bags.evaluation.EvaluationData` (None when it failed). Never raises
    for a bad bag: the row says what went wrong."""
    from uq_eval.bags.evaluation import BagEvaluator, run_evaluation
    from uq_eval.bags.reader import BagError, BagStream
    from uq_eval.bags.report import compute_metrics

    row = BagRow(str(path), worker=worker)
    start = time.perf_counter()
    data = None
    try:
        stream = BagStream(path, settings.image_topic, settings.ground_truth_topic)
        try:
            if stream.image_topic is None:
                raise BagError(f'bag {path}: no image topic to evaluate offline')
            evaluator = BagEvaluator(perception, None, str(path), settings.arbitration_values)
            data = run_evaluation(stream, evaluator, progress=False)
        finally:
            stream.close()
        if not data.frames:
            row.error = f'bag {path}: no image could be evaluated' + (
                f' ({"; ".join(data.problems)})' if data.problems else '')
            data = None
    except BagError as err:
        row.error = str(err)
    except Exception as err:  # a damaged file can fail anywhere in the readers
        row.error = f'bag {path}: {type(err).__name__}: {err}'
    row.seconds = round(time.perf_counter() - start, 3)
    if data is not None:
        metrics = compute_metrics(data)
        row.frames, row.detections = metrics['frames'], metrics['detections']
        row.frames_per_s = round(row.frames / row.seconds, 2) if row.seconds > 0 else 0.0
        row.help_requests = metrics['help_requests']
        for name in ('map50', 'ece', 'ood_auroc', 'misclassification_auroc'):
            setattr(row, name, metrics.get(name))
        row.problems = list(data.problems)
    if row.error is not None:
        row.error = ' '.join(row.error.split())[:500]  # one line
    return row, data


class SerialRunner:
    """Every bag in this process, one after the other, with one perception."""

    def __init__(self, load_perception: Callable[[], Any]) -> None:
        self.perception = load_perception()
        self.workers = 1

    def run(self, bags: list[Path], settings: BagSettings) -> Iterator[tuple[int, BagRow,
                                                                            Any]]:
        """Yield ``(index, row, data)`` as each bag is done."""
        for i, bag in enumerate(bags):
            row, data = evaluate_bag(bag, self.perception, settings, 'serial')
            yield i, row, data

    def close(self) -> None:
        """Nothing to release."""


class RayRunner:
    """The bags as Ray tasks on ``workers`` actors, each with its own perception.

    Raises
    ------
    ImportError
        When Ray is not installed (:data:`RAY_INSTALL` says how to install it).
    RuntimeError
        When the cluster cannot be started or joined.
    """

    def __init__(self, workers: int, address: str | None = None,
                 torch_threads: int = 1) -> None:
        try:
            import ray
        except ImportError as err:
            raise ImportError(RAY_INSTALL) from err
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            # Workers inherit this environment (the workspace's PYTHONPATH, AMENT paths).
            env = {k: v for k, v in os.environ.items()
                   if k in ('PYTHONPATH', 'LD_LIBRARY_PATH', 'AMENT_PREFIX_PATH',
                            'UQ_CACHE_DIR', 'ROS_HOME')}
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                          logging_level='ERROR',
                                          runtime_env={'env_vars': env})
            if address is None:
                kwargs['num_cpus'] = workers
            else:
                kwargs['address'] = address
            try:
                ray.init(**kwargs)
            except Exception as err:  # Ray raises several kinds; one line for the user
                raise RuntimeError(f'cannot start or join the Ray cluster'
                                   f'{" at " + address if address else ""}: {err}') from err
        worker_class: Any = ray.remote(num_cpus=1)(_BagWorker)
        self.actors: list[Any] = [worker_class.remote(torch_threads, f'worker-{i}')
                                  for i in range(workers)]
        self.workers = workers
        # Each worker has loaded its perception before the first bag is handed out, as the
        # serial runner has before it starts: the evaluation's time is the bags' alone.
        try:
            ray.get([actor.ready.remote() for actor in self.actors])
        except Exception as err:
            self.close()
            raise RuntimeError(f'the Ray workers could not load the perception: '
                               f'{" ".join(str(err).split())[:300]}') from err

    def run(self, bags: list[Path], settings: BagSettings) -> Iterator[tuple[int, BagRow,
                                                                            Any]]:
        """Yield ``(index, row, data)`` as each bag is done (in completion order)."""
        ray = self._ray
        free = list(self.actors)
        running: dict[Any, tuple[int, Any]] = {}
        queue = list(enumerate(bags))
        while queue or running:
            while queue and free:
                index, bag = queue.pop(0)
                actor = free.pop()
                running[actor.evaluate.remote(str(bag), settings)] = (index, actor)
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                index, actor = running.pop(ref)
                free.append(actor)
                try:
                    row, data = ray.get(ref)
                except Exception as err:  # the worker died: that bag's row says so
                    row, data = BagRow(str(bags[index]), error=' '.join(
                        f'the worker evaluating it failed: {err}'.split())[:500]), None
                yield index, row, data

    def close(self) -> None:
        """Stop the actors, and the local cluster when this runner started it."""
        for actor in self.actors:
            self._ray.kill(actor)
        if self._started:
            self._ray.shutdown()


class _BagWorker:
    """A Ray actor: one perception, many bags."""

    def __init__(self, torch_threads: int, name: str) -> None:
        from uq_eval.bags.evaluation import load_shipped_perception

        self.name = name
        self.perception = load_shipped_perception(torch_threads=torch_threads)

    def ready(self) -> str:
        return self.name

    def evaluate(self, bag: str, settings: BagSettings) -> tuple[BagRow, Any]:
        return evaluate_bag(Path(bag), self.perception, settings, self.name)


# -- merging ---------------------------------------------------------------------------------

def merge_data(parts: Iterable[Any]) -> Any:
    """One :class:`~uq_eval.bags.evaluation.EvaluationData` holding every part's frames,
    detections and matches (pooled), in the order given."""
    from uq_eval.bags.evaluation import EvaluationData

    merged = EvaluationData()
    for part in parts:
        if not merged.class_names:
            merged.class_names = list(part.class_names)
        for f in fields(EvaluationData):
            value, into = getattr(part, f.name), getattr(merged, f.name)
            if f.name == 'class_names':
                continue
            if isinstance(into, list):
                into.extend(value)
            elif f.name == 'ap_inputs':
                for name, rows in value.items():
                    into.setdefault(name, []).extend(rows)
            elif f.name == 'ground_truth_counts':
                for name, count in value.items():
                    into[name] = into.get(name, 0) + count
            elif f.name in ('ground_truth_frames', 'ground_truth_unmatched'):
                setattr(merged, f.name, into + value)
            elif f.name == 'ground_truth_exhaustive':
                merged.ground_truth_exhaustive = into and value
            elif f.name == 'ground_truth_source':
                merged.ground_truth_source = into or value
    return merged


def _quality(metrics: dict) -> dict[str, float | None]:
    return {name: metrics.get(name) for name in CI_METRICS}


def bootstrap_intervals(parts: list[Any], resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> dict[str, list[float] | None]:
    """95 % percentile intervals of the pooled quality metrics, resampling whole bags with
    replacement (a fixed seed: the same bags give the same intervals)."""
    from uq_eval.bags.report import compute_metrics

    if len(parts) < 2:
        return dict.fromkeys(CI_METRICS)
    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {name: [] for name in CI_METRICS}
    for _ in range(resamples):
        pick = rng.integers(0, len(parts), len(parts))
        values = _quality(compute_metrics(merge_data(parts[i] for i in pick)))
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                samples[name].append(float(value))
    return {name: ([float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
                   if len(v) >= resamples // 2 else None) for name, v in samples.items()}


def merge_report(rows: list[BagRow], parts: list[Any], wall_s: float, runner: str,
                 workers: int, top: int = 3) -> dict[str, Any]:
    """The merged report as a JSON-friendly dictionary (``parts``: the evaluated bags'
    data, in the rows' order)."""
    from uq_eval.bags.report import compute_metrics

    evaluated = [r for r in rows if r.error is None]
    pooled = compute_metrics(merge_data(parts)) if parts else {}
    frames = sum(r.frames for r in evaluated)
    slowest = sorted(evaluated, key=lambda r: r.frames_per_s)[:top]
    worst = sorted(evaluated, key=lambda r: (
        r.map50 if r.map50 is not None else math.inf,
        -(r.ece if r.ece is not None else -math.inf)))[:top]
    return {
        'runner': runner, 'workers': workers, 'bags': len(rows),
        'bags_evaluated': len(evaluated), 'bags_failed': len(rows) - len(evaluated),
        'frames': frames, 'wall_s': round(wall_s, 2),
        'frames_per_s': round(frames / wall_s, 2) if wall_s > 0 else None,
        'pooled': {name: pooled.get(name) for name in
                   ('frames', 'detections', 'help_requests', *CI_METRICS)},
        'pooled_ci95': bootstrap_intervals(parts),
        'bootstrap': {'resamples': BOOTSTRAP_RESAMPLES, 'unit': 'bag',
                      'seed': BOOTSTRAP_SEED},
        'slowest': [r.bag for r in slowest], 'worst': [r.bag for r in worst],
        'rows': [asdict(r) for r in rows],
    }


def _fmt(value: Any) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return f'{value:.3f}'
    return str(value)


def report_markdown(report: dict[str, Any]) -> str:
    """The merged report as Markdown (cells kept short)."""
    lines = [f'# Bag archive: {report["bags"]} bags ({report["bags_failed"]} failed)', '',
             f'{report["runner"]}, {report["workers"]} worker(s): {report["frames"]} frames '
             f'in {report["wall_s"]} s ({_fmt(report["frames_per_s"])} frames/s)', '',
             '## Pooled over the evaluated bags', '',
             '| metric | value | 95 % CI (bootstrap over bags) |', '|---|---|---|']
    for name in ('frames', 'detections', 'help_requests', *CI_METRICS):
        ci = report['pooled_ci95'].get(name)
        lines.append(f'| {name} | {_fmt(report["pooled"].get(name))} | '
                     f'{"-" if not ci else f"{ci[0]:.3f} - {ci[1]:.3f}"} |')
    lines += ['', f'Slowest: {", ".join(Path(b).name for b in report["slowest"]) or "-"}',
              '', f'Worst (AP@0.5, then ECE): '
              f'{", ".join(Path(b).name for b in report["worst"]) or "-"}', '',
              '## Bags', '',
              '| bag | frames | s | frames/s | AP@0.5 | ECE | OOD AUROC | error |',
              '|---|---|---|---|---|---|---|---|']
    for row in report['rows']:
        error = row['error'] or ''
        if len(error) > 100:
            error = error[:97] + '...'
        lines.append(f'| {Path(row["bag"]).name} | {row["frames"]} | {row["seconds"]} | '
                     f'{row["frames_per_s"]} | {_fmt(row["map50"])} | {_fmt(row["ece"])} | '
                     f'{_fmt(row["ood_auroc"])} | {error.replace("|", "/")} |')
    return '\n'.join(lines) + '\n'


def evaluate_archive(bags: list[Path], runner: Any, settings: BagSettings,
                     progress: bool = True) -> dict[str, Any]:
    """Run ``runner`` over ``bags`` with a progress bar; the merged report."""
    from tqdm import tqdm

    rows: list[BagRow | None] = [None] * len(bags)
    parts: list[Any] = [None] * len(bags)
    start = time.perf_counter()
    with tqdm(total=len(bags), desc='evaluating bags', unit='bag', disable=not progress,
              mininterval=0.2) as bar:
        for index, row, data in runner.run(bags, settings):
            rows[index], parts[index] = row, data
            bar.update(1)
            if row.error is not None:
                bar.write(f'warning: {row.error}')
    wall = time.perf_counter() - start
    done = [r for r in rows if r is not None]
    name = 'ray' if isinstance(runner, RayRunner) else 'serial'
    return merge_report(done, [p for p in parts if p is not None], wall, name,
                        runner.workers)
