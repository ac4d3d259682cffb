"""The closed loop's process handling, with a stand-in node (no ROS, no sim)."""

from __future__ import annotations

import os
from pathlib import Path

from uq_eval.closed_loop.loop import (
    CONFIG,
    LABELLER,
    NODE_CONFIGS,
    READY_LINES,
    ClosedLoop,
    help_node_args,
    labeller_args,
)

# Logs its arguments and the labeller's ready line, then waits to be stopped.
STAND_IN = '''
import sys, time
print(' '.join(sys.argv[1:]), flush=True)
print('answering help requests', flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    pass
'''


def test_a_helper_node_reads_its_own_file_first_is_awaited_by_its_line_and_stops(
        tmp_path, monkeypatch):
    (tmp_path / 'stand_in_node.py').write_text(STAND_IN)
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get('PYTHONPATH')])]))
    loop = ClosedLoop(tmp_path / 'logs', 0, with_optional=False)
    loop.log_dir.mkdir()
    name = LABELLER[0]
    log = loop.log_dir / f'{name}.log'
    try:
        loop.extra_args[name] = labeller_args(2.5)
        loop.start(name, 'stand_in_node')
        assert loop.wait_for_output(name, READY_LINES[name], 30.0), log.read_text()
        # The node's own file, then the loop's, then the caller's arguments.
        argv = log.read_text().splitlines()[0].split()
        assert argv == ['--ros-args', '--params-file', str(NODE_CONFIGS[name]),
                        '--params-file', str(CONFIG), '-p', 'answer_delay_s:=2.5']
        # A restart is awaited on its own output, not on the earlier run's.
        loop.restart(name, [])
        assert loop.wait_for_output(name, READY_LINES[name], 30.0)
        assert not loop.wait_for_output(name, 'answer_delay_s:=2.5', 0.5)
        # A stopped node is no dead node.
        loop.stop(name)
        assert name not in loop.processes and loop.dead() == []
        loop.stop(name)  # stopping it again changes nothing
    finally:
        loop.__exit__(None, None, None)


def test_a_harness_help_node_keeps_its_labels_apart_and_serves_no_page():
    store = Path('/somewhere/labels.sqlite3')
    assert help_node_args(store) == ['-p', f'label_store_url:={store}',
                                     '-p', 'web_enabled:=false']
    assert ClosedLoop(Path('logs'), 0).extra_args['ask_for_help_node'] == \
        help_node_args(Path('logs') / 'labels.sqlite3')
