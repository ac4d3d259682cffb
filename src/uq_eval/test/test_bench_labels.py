"""``uq bench labels``: ten simulated robots filing requests and reading their answers while
two labellers answer, on both label store back ends (a short run; the documented figures come
from the 60 s default), with nothing acknowledged lost."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from uq_eval.benchmarks import labels as bench


@pytest.fixture(params=['sqlite', 'postgresql'])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == 'sqlite':
        return f'sqlite://{tmp_path}/labels.sqlite3'
    return request.getfixturevalue('postgres_url')


def test_ten_robots_lose_no_acknowledged_label(store_url: str) -> None:
    # Two seconds of load: every robot keeps two requests in flight from the start, so the
    # store takes concurrent filing and racing answers throughout (hundreds of labels); the
    # checks below are counts that must match, whatever the length.
    result = bench.run_load(store_url, 'test', robots=10, labellers=2, duration_s=2.0)
    assert result.errors == []
    assert result.requests_filed >= 10  # every robot filed requests ...
    assert result.answers_acknowledged == result.requests_filed  # ... all were answered
    assert result.answers_received == result.requests_filed  # ... and their robots saw it
    assert (result.labels_lost, result.requests_lost, result.labels_stored_twice) == (0, 0, 0)
    assert result.throughput_per_s > 1.0
    assert 0.0 < result.answer_ms_p50 <= result.answer_ms_p99
    assert 0.0 < result.round_trip_ms_p50 <= result.round_trip_ms_p99


def test_the_command_reports_a_table_and_json(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / 'bench.json'
    args = argparse.Namespace(backend='sqlite', store_url=None, robots=3, labellers=1,
                              duration=1.0, inflight=1, json=out)
    assert bench.run(args) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ['back', 'end', 'robots'] and table[1].startswith('sqlite')
    assert '"labels_lost": 0' in out.read_text()


def test_a_store_that_cannot_be_used_is_one_line_and_exit_2(capsys: Any) -> None:
    args = argparse.Namespace(backend='both', store_url='mysql://h/db', robots=1, labellers=1,
                              duration=1.0, inflight=1, json=None)
    assert bench.run(args) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith("error: label store URL 'mysql://h/db'")
