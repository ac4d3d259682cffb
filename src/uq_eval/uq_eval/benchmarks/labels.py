"""``uq bench labels``: a fleet's load on the label store (ROS-free).

Simulated robots (threads, each with its own store connection) file help requests and follow
the store's change feed for their answers, while simulated labellers answer whatever is
pending, for a fixed time; several labellers answering the same request at once is part of
the load (their answers are the same, so all but one are duplicates). Then a fresh connection
checks that every acknowledged request and answer is in the store, once.

Reported: answers stored per second (throughput), the latency of an answer (the store's
``answer`` call: commit to disk included) and of a round trip (request filed until its robot
reads the answer), p50 and p99, and the acknowledged labels and requests lost (must be 0).
The SQLite back end runs on a temporary file, PostgreSQL on a private temporary server
(:class:`uq_autonomy.labels.postgres_server.TemporaryPostgres`, fsync on), unless ``--store-url``
names a store to load (its contents are kept; the load adds requests and labels to it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uq_common.arguments import positive_float, positive_int

CLASSES = ('mug', 'box', 'cone', 'torus', 'bottle')


@dataclass
class LoadResult:
    """What one load run measured."""

    backend: str
    robots: int
    labellers: int
    duration_s: float
    requests_filed: int = 0
    answers_acknowledged: int = 0
    answer_calls: int = 0
    duplicates: int = 0
    answers_received: int = 0
    throughput_per_s: float = 0.0
    answer_ms_p50: float = 0.0
    answer_ms_p99: float = 0.0
    round_trip_ms_p50: float = 0.0
    round_trip_ms_p99: float = 0.0
    labels_lost: int = 0
    requests_lost: int = 0
    labels_stored_twice: int = 0
    errors: list[str] = field(default_factory=list)


def _label_for(request_id: str) -> str:
    # The same answer from every labeller: racing answers are duplicates, never conflicts.
    return CLASSES[zlib.crc32(request_id.encode()) % len(CLASSES)]


def run_load(store_url: str, backend: str, robots: int = 10, labellers: int = 2,
             duration_s: float = 60.0, inflight: int = 2, poll_period_s: float = 0.05,
             drain_s: float = 10.0) -> LoadResult:
    """Run the load against the store at ``store_url`` and check what it acknowledged."""
    from uq_autonomy.help.crops import encode_png
    from uq_autonomy.labels.store import AnswerStatus, LabelStoreError, PendingRequest
    from uq_autonomy.labels.url import open_label_store

    result = LoadResult(backend, robots, labellers, duration_s)
    run_id = uuid.uuid4().hex[:8]
    lock = threading.Lock()
    filed: dict[str, float] = {}          # request id -> time filed (acknowledged)
    acknowledged: dict[str, str] = {}     # request id -> label (acknowledged answers)
    answer_ms: list[float] = []
    round_trip_ms: list[float] = []
    received: set[str] = set()
    stop_filing = threading.Event()
    stop_all = threading.Event()
    rng = np.random.default_rng(0)
    crop = encode_png(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
    # Opened here, one connection each, so that a store that cannot be opened fails at once.
    robot_stores = [open_label_store(store_url) for _ in range(robots)]
    labeller_stores = [open_label_store(store_url) for _ in range(labellers)]

    def error(where: str, err: BaseException) -> None:
        with lock:
            result.errors.append(f'{where}: {err}')

    def robot(k: int) -> None:
        store = robot_stores[k]
        robot_id = f'robot-{k:02d}'
        outstanding: dict[str, float] = {}
        since = store.last_seq()
        n = 0
        while not stop_all.is_set():
            try:
                while not stop_filing.is_set() and len(outstanding) < inflight:
                    rid = f'{run_id}-{robot_id}-{n}'
                    n += 1
                    store.add_request(PendingRequest(
                        rid, reason='load test', candidates=(('mug', 0.5), ('box', 0.3)),
                        crop_png=crop, embedding=rng.normal(size=64).astype(np.float32),
                        box=(4.0, 4.0, 20.0, 20.0), robot_id=robot_id))
                    now = time.monotonic()
                    outstanding[rid] = now
                    with lock:
                        filed[rid] = now
                for record in store.labels(since_seq=since, robot_id=robot_id):
                    since = max(since, record.seq)
                    sent = outstanding.pop(record.request_id, None)
                    if sent is not None:
                        with lock:
                            round_trip_ms.append((time.monotonic() - sent) * 1e3)
                            received.add(record.request_id)
                if stop_filing.is_set() and not outstanding:
                    return
            except LabelStoreError as err:
                error(robot_id, err)
            time.sleep(poll_period_s)

    def labeller(k: int) -> None:
        store = labeller_stores[k]
        while not stop_all.is_set():
            try:
                pending = store.pending_requests(limit=20)
                # Labellers take the queue from opposite ends, and meet in the middle.
                for request in (pending if k % 2 == 0 else pending[::-1]):
                    label = _label_for(request.request_id)
                    start = time.monotonic()
                    answer = store.answer(request.request_id, label, f'labeller-{k}',
                                          source='bench')
                    elapsed = (time.monotonic() - start) * 1e3
                    with lock:
                        result.answer_calls += 1
                        answer_ms.append(elapsed)
                        if answer.accepted:
                            acknowledged[request.request_id] = label
                        if answer.status is AnswerStatus.DUPLICATE:
                            result.duplicates += 1
                        elif not answer.accepted:
                            result.errors.append(f'labeller-{k}: {answer.message}')
                if not pending:
                    time.sleep(0.005)
            except LabelStoreError as err:
                error(f'labeller-{k}', err)
                time.sleep(0.05)

    threads = [threading.Thread(target=robot, args=(k,), daemon=True) for k in range(robots)]
    threads += [threading.Thread(target=labeller, args=(k,), daemon=True)
                for k in range(labellers)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(duration_s)
    stop_filing.set()
    elapsed = time.monotonic() - start
    deadline = time.monotonic() + drain_s
    for t in threads[:robots]:  # robots wait for their outstanding answers
        t.join(max(0.0, deadline - time.monotonic()))
    stop_all.set()
    for t in threads:
        t.join(10.0)
    for s in robot_stores + labeller_stores:
        s.close()

    with open_label_store(store_url) as check:
        stored = {r.request_id: r for r in check.labels() if r.request_id.startswith(run_id)}
        requests_seen = sum(check.get_request(rid) is not None for rid in filed)
    result.requests_filed = len(filed)
    result.requests_lost = len(filed) - requests_seen
    result.answers_acknowledged = len(acknowledged)
    result.labels_lost = sum(1 for rid, label in acknowledged.items()
                             if rid not in stored or stored[rid].label != label)
    result.labels_stored_twice = len([r for r in stored.values() if r.revision != 1])
    result.answers_received = len(received)
    answered_in_time = sum(1 for rid in acknowledged if rid in received)
    result.throughput_per_s = answered_in_time / elapsed if elapsed > 0 else 0.0
    result.duration_s = round(elapsed, 2)
    for name, values in (('answer_ms', answer_ms), ('round_trip_ms', round_trip_ms)):
        if values:
            setattr(result, f'{name}_p50', round(float(np.percentile(values, 50)), 2))
            setattr(result, f'{name}_p99', round(float(np.percentile(values, 99)), 2))
    result.throughput_per_s = round(result.throughput_per_s, 1)
    return result


def configure(parser: argparse.ArgumentParser) -> None:
    """Load the label store as a fleet does: robots filing requests, people answering."""
    parser.add_argument('--backend', choices=('sqlite', 'postgresql', 'both'), default='both',
                        help='store(s) to load: a temporary SQLite file, a private temporary '
                             'PostgreSQL server, or both')
    parser.add_argument('--store-url', default=None, metavar='URL',
                        help='load this store instead (sqlite:///path or postgresql://...; '
                             'its contents are kept)%(default).0s')
    parser.add_argument('--robots', type=positive_int, default=10,
                        help='simulated robots filing requests and reading their answers')
    parser.add_argument('--labellers', type=positive_int, default=2,
                        help='simulated people answering the pending requests')
    parser.add_argument('--duration', type=positive_float, default=60.0, metavar='SECONDS',
                        help='how long the robots file requests')
    parser.add_argument('--inflight', type=positive_int, default=2,
                        help='requests each robot keeps waiting for an answer at once')
    parser.add_argument('--json', type=Path, default=None, metavar='FILE',
                        help='also write the results as JSON%(default).0s')
    parser.set_defaults(run=run)


def _table(results: list[LoadResult]) -> str:
    rows = [('back end', 'robots', 's', 'answers/s', 'answer p50/p99 ms',
             'round trip p50/p99 ms', 'acknowledged', 'lost')]
    for r in results:
        rows.append((r.backend, str(r.robots), f'{r.duration_s:g}', f'{r.throughput_per_s:g}',
                     f'{r.answer_ms_p50:g} / {r.answer_ms_p99:g}',
                     f'{r.round_trip_ms_p50:g} / {r.round_trip_ms_p99:g}',
                     str(r.answers_acknowledged), str(r.labels_lost + r.requests_lost)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return '\n'.join('  '.join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def run(args: argparse.Namespace) -> int:
    """Run the load on each back end; exit 1 when an acknowledged label or request was lost
    or a call failed, 2 on a store that cannot be used."""
    from uq_autonomy.labels.postgres_server import PostgresUnavailable, TemporaryPostgres
    from uq_autonomy.labels.store import LabelStoreError
    from uq_autonomy.labels.url import parse_store_url

    settings: dict[str, Any] = dict(robots=args.robots, labellers=args.labellers,
                                    duration_s=args.duration, inflight=args.inflight)
    results: list[LoadResult] = []
    try:
        if args.store_url is not None:
            kind = parse_store_url(args.store_url).kind
            results.append(run_load(args.store_url, kind, **settings))
        for backend in (() if args.store_url else
                        ('sqlite', 'postgresql') if args.backend == 'both' else (args.backend,)):
            print(f'{backend}: {args.robots} robots, {args.labellers} labellers, '
                  f'{args.duration:g} s ...', file=sys.stderr, flush=True)
            if backend == 'sqlite':
                with tempfile.TemporaryDirectory(prefix='uq-bench-labels-') as tmp:
                    results.append(run_load(f'sqlite://{tmp}/labels.sqlite3', backend,
                                            **settings))
            else:
                with TemporaryPostgres() as server:
                    results.append(run_load(server.create_database('bench'), backend,
                                            **settings))
    except (ValueError, LabelStoreError, PostgresUnavailable) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(_table(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + '\n',
                             encoding='utf-8')
    failed = False
    for r in results:
        for message in r.errors[:5]:
            print(f'error: {r.backend}: {message}', file=sys.stderr)
        if r.labels_lost or r.requests_lost or r.errors:
            failed = True
            print(f'error: {r.backend}: {r.labels_lost} acknowledged labels and '
                  f'{r.requests_lost} requests lost, {len(r.errors)} failed calls',
                  file=sys.stderr)
    return 1 if failed else 0
