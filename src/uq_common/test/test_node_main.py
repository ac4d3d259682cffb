"""``run_node`` ends a busy node cleanly on SIGINT and SIGTERM, every time.

The node publishes from a 2 kHz timer to its own subscription, so a signal lands while a
callback runs or the executor is between waits: the windows in which rclpy's own handler
either lost the signal (the executor re-waited on a context about to shut down) or let a
callback's publish on the shut-down context escape as a traceback.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

BUSY_NODE = textwrap.dedent('''
    import argparse, sys
    from rclpy.node import Node
    from std_msgs.msg import Empty
    from uq_common.node_main import run_node

    class Busy(Node):
        def __init__(self):
            super().__init__('busy')
            publisher = self.create_publisher(Empty, 'tick', 10)
            self.create_subscription(Empty, 'tick', lambda _: None, 10)
            self.create_timer(0.0005, lambda: publisher.publish(Empty()))
            print('spinning', flush=True)

    sys.exit(run_node(Busy, argparse.ArgumentParser(prog='busy'), ['busy']))
''')


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM], ids=['SIGINT', 'SIGTERM'])
def test_busy_node_exits_cleanly_on_signal(signum):
    env = os.environ | {'ROS_DOMAIN_ID': '61'}
    for _attempt in range(5):
        node = subprocess.Popen([sys.executable, '-c', BUSY_NODE], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert node.stdout.readline().strip() == 'spinning', node.stderr.read()
            time.sleep(0.3)  # into the busy spin
            node.send_signal(signum)
            _, stderr = node.communicate(timeout=20)
        finally:
            node.kill()
            node.wait()
        assert node.returncode == 0, stderr
        assert 'Traceback' not in stderr, stderr


def test_a_node_refusing_to_start_exits_with_its_reason():
    script = textwrap.dedent('''
        import argparse, sys
        from uq_common.node_main import run_node

        def refuse():
            raise ValueError('rate must be positive')

        sys.exit(run_node(refuse, argparse.ArgumentParser(prog='refuser'), ['refuser']))
    ''')
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                            timeout=60, env=os.environ | {'ROS_DOMAIN_ID': '61'})
    assert result.returncode == 1
    assert 'refuser: refusing to start: rate must be positive' in result.stderr
