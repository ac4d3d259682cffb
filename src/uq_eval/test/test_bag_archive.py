"""``uq eval bag ARCHIVE [--ray]``: ten short ``uq sim record`` bags and two broken ones,
evaluated serially in one process and on a real local Ray cluster with two workers; the
merged metrics agree, and the broken bags are reported in their rows without stopping the
run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from uq_eval.bags.archive import ArchiveError, find_bags

BAGS = 10
FRAMES = 4
RATE_HZ = 4.0


def uq(*argv: str) -> int:
    """Run a ``uq`` subcommand in this process, as the console script does."""
    from uq_common.cli import main
    return main(list(argv))


@pytest.fixture(scope='module')
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten bags of the unknown_static scenario from different start times, one bag without
    metadata.yaml and one whose MCAP file is garbage."""
    from uq_eval.bags.record import record_scenario

    root = tmp_path_factory.mktemp('archive')
    for i in range(BAGS):
        record_scenario(root / f'bag_{i:02d}', 'unknown_static', duration=FRAMES / RATE_HZ,
                        rate_hz=RATE_HZ, start_time=1.5 * i)
    broken = root / 'bag_98_no_metadata'
    broken.mkdir()
    (broken / 'bag.mcap').write_bytes(b'\x89MCAP0\r\n' + b'garbage' * 100)
    garbage = root / 'bag_99_garbage'
    garbage.mkdir()
    (garbage / 'metadata.yaml').write_text((root / 'bag_00' / 'metadata.yaml').read_text())
    (garbage / 'bag_00_0.mcap').write_bytes(b'not an mcap file at all' * 500)
    return root


QUALITY = ('map50', 'ece', 'accuracy_matched', 'misclassification_auroc', 'aurc', 'ood_auroc')


def _run(archive: Path, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code = uq('eval', 'bag', str(archive), '--out', str(out), '--no-progress', *extra)
    return code, json.loads((out / 'archive_report.json').read_text())


@pytest.mark.slow
def test_ray_and_serial_runs_agree_and_broken_bags_do_not_stop_them(archive: Path,
                                                                     tmp_path: Path,
                                                                     capsys: Any) -> None:
    pytest.importorskip('ray', reason='ray is not installed (make setup installs the extra)')
    code, serial = _run(archive, tmp_path / 'serial')
    assert code == 2  # two bags failed
    err = capsys.readouterr().err
    assert 'Traceback' not in err and 'missing metadata.yaml' in err
    code, parallel = _run(archive, tmp_path / 'ray', '--ray', '--workers', '2')
    assert code == 2

    for report in (serial, parallel):
        assert (report['bags'], report['bags_evaluated'], report['bags_failed']) == (12, 10, 2)
        rows = {Path(r['bag']).name: r for r in report['rows']}
        assert 'missing metadata.yaml' in rows['bag_98_no_metadata']['error']
        assert rows['bag_99_garbage']['error'] and rows['bag_99_garbage']['frames'] == 0
        assert all(rows[f'bag_{i:02d}']['frames'] == FRAMES for i in range(BAGS))
        assert report['frames'] == BAGS * FRAMES
        assert len(report['slowest']) == len(report['worst']) == 3
        assert report['pooled']['map50'] is not None and report['pooled']['ood_auroc']
        low, high = report['pooled_ci95']['ood_auroc']
        assert low <= report['pooled']['ood_auroc'] <= high
    assert serial['runner'] == 'serial' and parallel['runner'] == 'ray'
    assert {r['worker'] for r in parallel['rows'] if not r['error']} == {'worker-0',
                                                                        'worker-1'}
    # The same bags, the same numbers: pooled metrics, their intervals and every row.
    assert {k: parallel['pooled'][k] for k in QUALITY} == pytest.approx(
        {k: serial['pooled'][k] for k in QUALITY}, rel=1e-9)
    assert parallel['pooled_ci95'] == serial['pooled_ci95']
    assert parallel['pooled']['detections'] == serial['pooled']['detections']
    for mine, theirs in zip(parallel['rows'], serial['rows'], strict=True):
        assert (mine['bag'], mine['frames'], mine['detections'], mine['map50'], mine['ece']) \
            == (theirs['bag'], theirs['frames'], theirs['detections'], theirs['map50'],
                theirs['ece'])
    markdown = (tmp_path / 'ray' / 'archive_report.md').read_text()
    assert '| bag_99_garbage | 0 |' in markdown
    assert max(len(cell) for line in markdown.splitlines() for cell in line.split('|')) <= 120


def test_a_list_file_names_the_bags(archive: Path, tmp_path: Path) -> None:
    listing = tmp_path / 'bags.txt'
    listing.write_text(f'# two bags\n{archive / "bag_00"}\n\n{archive / "bag_01"}  # second\n')
    assert find_bags(listing) == [archive / 'bag_00', archive / 'bag_01']
    code, report = _run(listing, tmp_path / 'out')
    assert code == 0 and report['bags_evaluated'] == 2 and report['frames'] == 2 * FRAMES


def test_archives_that_cannot_be_listed(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(ArchiveError, match='does not exist'):
        find_bags(tmp_path / 'missing')
    listing = tmp_path / 'bags.txt'
    listing.write_text('# nothing yet\n')
    assert uq('eval', 'bag', str(listing), '--no-progress') == 2
    assert capsys.readouterr().err == f'error: {listing} holds no bag (no sub-folder, no ' \
                                      f'listed path)\n'
    (tmp_path / 'empty').mkdir()  # a folder of nothing: an archive only with --ray
    assert uq('eval', 'bag', str(tmp_path / 'empty'), '--ray', '--no-progress') == 2
    assert 'holds no bag' in capsys.readouterr().err


def test_without_ray_the_option_says_how_to_install_it(archive: Path, tmp_path: Path,
                                                      capsys: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, 'ray', None)  # as if it were not installed
    assert uq('eval', 'bag', str(archive), '--ray', '--out', str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err == ('error: ray is not installed: install the optional extra with pip install '
                   '-c requirements/constraints.txt -r requirements/ray.in\n')
