"""Smoke test of ``uq bench gp --quick``: one JSON line per configuration, finite figures."""

import json
import math
import subprocess
import sys

KEYS = ('n', 'dim', 'experts', 'fit_seconds', 'peak_rss_mb', 'query_us_per_item', 'update_us',
        'forward_ms', 'query_overhead_ratio')


def test_quick_benchmark_prints_finite_json_lines():
    proc = subprocess.run(
        [sys.executable, '-m', 'uq_common.cli', 'bench', 'gp', '--quick', '--n', '3000',
         '--experts', '1', '--experts', '3', '--threads', '1'],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert [(r['n'], r['experts']) for r in lines] == [(3000, 1), (3000, 3)]
    for record in lines:
        for key in KEYS:
            value = record[key]
            assert isinstance(value, int | float) and math.isfinite(value), (key, value)
            assert value > 0, (key, value)
        per_image = record['query_us_per_item'] * record['detections_per_image']
        assert math.isclose(record['query_overhead_ratio'],
                            per_image / 1e3 / record['forward_ms'], rel_tol=0.05)
    assert 'fit' in proc.stderr


def test_invalid_configuration_is_rejected(capsys):
    # In this process, through the console script's main(): the refusal comes before any
    # worker, and a process of its own only added the interpreter's start and the commands'
    # imports (seconds); the test above runs the command as its own process.
    from uq_common.cli import main

    assert main(['bench', 'gp', '--n', '2', '--experts', '4']) == 2
    captured = capsys.readouterr()
    assert 'invalid configuration' in captured.err and captured.out == ''
