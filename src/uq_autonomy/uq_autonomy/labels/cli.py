"""``uq labels`` subcommands: ``list``, ``export --coco DIR``, ``import FILE`` and ``serve``.

They work on the label store directly (``--store-url``: an SQLite file, ``sqlite:///path``,
or a fleet's ``postgresql://user@host:port/db``; default ``$UQ_LABEL_STORE``, else
``$XDG_DATA_HOME/uq_autonomy/labels.sqlite3``), so they also work while no node runs. Labels
imported while the ask-for-help nodes run reach their detectors within the nodes'
``fleet_poll_period_s``. On a fleet store, ``list`` and ``export`` cover every robot
(``list --robot`` one); ``serve`` is the labelling page for the whole fleet.

Exit status: 0 when everything was done; 1 when the store could not be used or an entry was
refused (the messages say which and why); 2 on an unreadable or malformed input file (an
invalid entry included) or export directory. An import stores all its entries or none.

Kept cheap to import: the store and NumPy load inside the ``run`` functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from uq_common.arguments import positive_int

# '%(default).0s' prints nothing: it only stops the command host's
# ArgumentDefaultsHelpFormatter from appending "(default: None)".
_STORE_HELP = ('label store: an SQLite file or sqlite:///path, or a fleet\'s '
               'postgresql://user@host:port/database; when omitted, $UQ_LABEL_STORE, else '
               '$XDG_DATA_HOME/uq_autonomy/labels.sqlite3%(default).0s')


def _add_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--store-url', '--store', dest='store', default=None, metavar='URL',
                        help=_STORE_HELP)


def _store_url(args: argparse.Namespace) -> str:
    """The store's URL, or a one-line error (ValueError) for a malformed one."""
    from uq_autonomy.labels.url import parse_store_url

    return str(parse_store_url(args.store))


def _error(message: str) -> None:
    print(f'error: {message}', file=sys.stderr)


def configure_list(parser: argparse.ArgumentParser) -> None:
    """List the labels in the label store (or the help requests still pending)."""
    _add_store(parser)
    parser.add_argument('--pending', action='store_true',
                        help='list pending help requests instead of labels')
    parser.add_argument('--json', action='store_true',
                        help='one JSON object per line instead of a table')
    parser.add_argument('--limit', type=positive_int, default=None,
                        help='show at most this many entries%(default).0s')
    parser.add_argument('--robot', default=None, metavar='ROBOT_ID',
                        help='only this robot\'s requests or labels (default: every '
                             'robot\'s)%(default).0s')
    parser.set_defaults(run=run_list)


def run_list(args: argparse.Namespace) -> int:
    """Print labels or pending requests; read-only files are opened read-only."""
    from uq_autonomy.labels.store import LabelStoreError, format_time
    from uq_autonomy.labels.url import open_store_for_reading

    try:
        _store_url(args)
        with open_store_for_reading(args.store) as store:
            path = store.location
            if args.pending:
                rows = [{'request_id': r.request_id, 'robot_id': r.robot_id,
                         'created': format_time(r.created),
                         'track_id': r.track_id, 'class_name': r.class_name,
                         'candidates': [[c, round(p, 3)] for c, p in r.candidates],
                         'reason': r.reason}
                        for r in store.pending_requests(args.limit, robot_id=args.robot)]
                columns: tuple[str, ...] = ('request_id', 'robot_id', 'created', 'track_id',
                                            'class_name', 'reason')
            else:
                records = store.labels(limit=args.limit, robot_id=args.robot)
                rows = [{'request_id': r.request_id, 'robot_id': r.robot_id, 'label': r.label,
                         'labeler': r.labeler, 'time': format_time(r.time),
                         'model_id': r.model_id,
                         'box': None if r.box is None else [round(v, 1) for v in r.box],
                         'revision': r.revision, 'source': r.source} for r in records]
                columns = ('request_id', 'robot_id', 'label', 'labeler', 'time', 'model_id',
                           'box')
    except ValueError as err:
        _error(str(err))
        return 2
    except LabelStoreError as err:
        _error(str(err))
        return 1
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    table = [list(columns)] + [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for line in table:
        print('  '.join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    what = 'pending requests' if args.pending else 'labels'
    print(f'{len(rows)} {what} in {path}', file=sys.stderr)
    return 0


def _cell(value: object) -> str:
    if value is None or value == '':
        return '-'
    if isinstance(value, list):
        return ','.join(str(v) for v in value)
    return str(value)


def configure_export(parser: argparse.ArgumentParser) -> None:
    """Export the stored labels as a COCO dataset (crops + JSON), every robot's in one file.

    On a fleet's store the one dataset holds the labels of every robot's requests; each
    image and annotation names its robot (``robot_id``)."""
    _add_store(parser)
    parser.add_argument('--coco', required=True, type=Path, metavar='DIR',
                        help='output directory (images/ and annotations/instances_default.json)')
    parser.add_argument('--overwrite', action='store_true',
                        help='write into DIR even when it is not empty')
    parser.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Write the COCO export and print the annotations file's path."""
    from uq_autonomy.labels.coco import export_coco
    from uq_autonomy.labels.store import LabelStoreError
    from uq_autonomy.labels.url import open_store_for_reading

    try:
        _store_url(args)
        with open_store_for_reading(args.store) as store:
            summary = export_coco(store, args.coco, overwrite=args.overwrite)
    except LabelStoreError as err:
        _error(str(err))
        return 1
    except (FileExistsError, OSError, ValueError) as err:
        _error(str(err))
        return 2
    print(summary.annotations_file)
    print(f'{summary.images} images, {len(summary.categories)} categories '
          f'({", ".join(summary.categories)})', file=sys.stderr)
    if summary.skipped_without_crop:
        print(f'{len(summary.skipped_without_crop)} labels without a crop left out: '
              f'{", ".join(summary.skipped_without_crop[:10])}', file=sys.stderr)
    return 0


def configure_import(parser: argparse.ArgumentParser) -> None:
    """Import labels from a COCO annotations file or a JSON-lines file of answers."""
    parser.add_argument('file', type=Path, metavar='FILE',
                        help='COCO annotations .json (e.g. an edited export), or .jsonl with '
                             'one {"request_id", "label", "labeler"} answer per line')
    _add_store(parser)
    parser.add_argument('--labeler', default=None,
                        help='record this labeler instead of the file\'s%(default).0s')
    parser.add_argument('--overrule', action='store_true',
                        help='replace labels that differ from the stored ones (the old ones '
                             'stay in the history); without it such entries are refused')
    parser.set_defaults(run=run_import)


def run_import(args: argparse.Namespace) -> int:
    """Import the file (all entries or none) and print a summary of what happened."""
    from uq_autonomy.labels.coco import import_labels
    from uq_autonomy.labels.store import LabelStoreError
    from uq_autonomy.labels.url import open_label_store
    from uq_autonomy.labels.validation import LabelValidationError, validate_labeler

    if not args.file.is_file():
        _error(f'{args.file} is not a file')
        return 2
    labeler = None
    if args.labeler is not None:
        try:
            labeler = validate_labeler(args.labeler)
        except LabelValidationError as err:
            _error(f'--labeler: {err}')
            return 2
    try:
        _store_url(args)
    except ValueError as err:
        _error(str(err))
        return 2
    try:
        with open_label_store(args.store) as store:
            summary = import_labels(store, args.file, labeler=labeler, overrule=args.overrule)
    except LabelStoreError as err:
        _error(str(err))
        return 1
    except (ValueError, OSError) as err:
        _error(str(err))
        return 2
    for message in summary.messages:
        print(message, file=sys.stderr)
    counts = ', '.join(f'{n} {status}' for status, n in sorted(summary.counts.items()))
    if summary.stored_nothing:
        print(f'nothing imported: {counts}')
        print(f'error: {args.file}: the store is unchanged; fix or remove the entries above '
              f'(an import is all or nothing)', file=sys.stderr)
        return 2 if summary.invalid else 1
    print(counts or 'nothing to import')
    return 1 if summary.refused else 0


def configure_serve(parser: argparse.ArgumentParser) -> None:
    """Serve the labelling page on a label store: every robot's open requests, a robot filter.

    Answers are stored there and reach each robot's detector through its ask-for-help node
    (which follows the store's new labels)."""
    _add_store(parser)
    parser.add_argument('--host', default='127.0.0.1',
                        help='address to bind; anything but loopback needs --token')
    parser.add_argument('--port', type=int, default=8766, help='TCP port (0: any free one)')
    parser.add_argument('--token', default=None,
                        help='access token (16+ printable characters)%(default).0s')
    parser.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted; 1 when the store cannot be opened, 2 on a bad option."""
    import time

    from uq_autonomy.labels.store import LabelStoreError
    from uq_autonomy.labels.url import open_label_store
    from uq_autonomy.labels.web import LabellingServer, WebConfig, store_submitter

    try:
        _store_url(args)
        config = WebConfig(host=args.host, port=args.port, token=args.token)
    except ValueError as err:
        _error(str(err))
        return 2
    try:
        store = open_label_store(args.store)
    except LabelStoreError as err:
        _error(str(err))
        return 1
    try:
        with LabellingServer(store.pending_requests, store_submitter(store), config) as server:
            print(f'labelling page for {store.location}: {server.url}', flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except OSError as err:
        _error(str(err))
        return 2
    finally:
        store.close()
