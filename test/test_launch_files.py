"""The launch files run by ``ros2 launch`` as a user runs them: arguments, bad input, respawn,
the simulation.

Needs the real ``ros2 launch`` (launch, launch_ros, ros2cli), which the ROS apt repository
publishes but PyPI does not: where ``launch_ros`` cannot be imported or ``ros2`` is not on
PATH, this module is skipped with that reason. Run it in an environment that has them
(docs/deployment.md, "Tests of the launch files"):

    source <launch virtualenv>/bin/activate && source install/setup.bash
    python -m pytest test/test_launch_files.py
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
import zlib
from pathlib import Path

import pytest
import yaml

pytest.importorskip('launch_ros', reason='launch_ros is not importable: ROS 2 launch is not on '
                    'PyPI; docs/deployment.md, "Tests of the launch files", says how to get it')
if shutil.which('ros2') is None:
    pytest.skip('the ros2 command is not on PATH (docs/deployment.md, "Tests of the launch '
                'files")', allow_module_level=True)

WORKSPACE = Path(__file__).resolve().parents[1]
LAUNCH_FILES = sorted((WORKSPACE / 'launch').glob('*.launch.py'))
# One domain per run: two runs at once on one host (two checkouts) shared one before, and
# their stacks, with the same node names, drove each other's lifecycles and topics.
DOMAIN_ID = 100 + (zlib.crc32(b'test_launch_files') + os.getpid()) % 100


class Launch:
    """``ros2 launch ARGS`` in its own process group, its output collected line by line."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID), PYTHONUNBUFFERED='1')
        self.process = subprocess.Popen(
            ['ros2', 'launch', *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return ''.join(self.lines)

    def wait_for(self, pattern: str, count: int = 1, timeout_s: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(re.findall(pattern, self.output)) >= count:
                return True
            if self.process.poll() is not None:
                self._reader.join(timeout=5)
                return len(re.findall(pattern, self.output)) >= count
            time.sleep(0.2)
        return False

    def finish(self, timeout_s: float = 60.0) -> int:
        """Wait for the launch to end by itself; returns its exit code."""
        try:
            code = self.process.wait(timeout=timeout_s)
        finally:
            self.kill()
        self._reader.join(timeout=5)
        return code

    def interrupt(self, timeout_s: float = 60.0) -> int:
        """Ctrl-C, as a user stops it; returns the exit code."""
        self.process.send_signal(signal.SIGINT)
        return self.finish(timeout_s)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def launch():
    started: list[Launch] = []

    def start(*args: str) -> Launch:
        started.append(Launch(*args))
        return started[-1]
    yield start
    for item in started:
        item.kill()


@pytest.mark.parametrize('path', LAUNCH_FILES, ids=lambda p: p.name)
def test_every_argument_is_documented(path):
    result = subprocess.run(['ros2', 'launch', str(path), '--show-args'],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    arguments = re.findall(r"^    '(\w+)':\n        (.*)$", result.stdout, re.MULTILINE)
    assert arguments, result.stdout
    undocumented = [name for name, text in arguments if 'no description given' in text]
    assert not undocumented, result.stdout


def test_the_stack_file_declares_its_main_arguments():
    result = subprocess.run(['ros2', 'launch', 'uq_bringup', 'uq_stack.launch.py', '--show-args'],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = set(re.findall(r"^    '(\w+)':", result.stdout, re.MULTILINE))
    assert {'namespace', 'image_topic', 'model_path', 'backend', 'use_sim_time', 'log_level',
            'autostart', 'respawn', 'respawn_delay', 'ask_for_help', 'profile'} <= names


@pytest.mark.parametrize('args,argument', [
    (['backend:=cuda'], 'backend'),
    (['model_path:=/nonexistent/detector.pt'], 'model_path'),
    (['gp_path:=/nonexistent/detector_gp.npz'], 'gp_path'),
    (['backend:=tensorrt'], 'engine_path'),
    (['backend:=tensorrt', 'engine_path:=/nonexistent/detector.ep'], 'engine_path'),
    (['profile:=lab'], 'profile'),
    (['log_level:=loud'], 'log_level'),
    (['autostart:=yes'], 'autostart'),
    (['respawn_delay:=-1'], 'respawn_delay'),
    (['overlay_params:=/nonexistent/params.yaml'], 'overlay_params'),
], ids=lambda v: v if isinstance(v, str) else ' '.join(v))
def test_bad_arguments_fail_at_start_naming_the_argument(launch, args, argument):
    run = launch('uq_bringup', 'uq_stack.launch.py', 'ask_for_help:=false', *args)
    code = run.finish(timeout_s=60)
    assert code != 0, run.output
    assert f"launch argument '{argument}'" in run.output, run.output
    assert 'process started' not in run.output, 'a node started despite the bad argument'


@pytest.mark.parametrize(('args', 'argument'), [
    (['closed_loop:=maybe'], 'closed_loop'),
    (['closed_loop:=true', 'seed:=-3'], 'seed'),
    (['closed_loop:=true', 'lookalike:=often'], 'lookalike'),
    (['scenario:=nowhere'], 'scenario'),
], ids=lambda v: v if isinstance(v, str) else ' '.join(v))
def test_bad_sim_arguments_fail_at_start_naming_the_argument(launch, args, argument):
    run = launch('uq_sim_bringup', 'sim.launch.py', 'ask_for_help:=false', *args)
    assert run.finish(timeout_s=60) != 0, run.output
    assert f"launch argument '{argument}'" in run.output, run.output
    assert 'process started' not in run.output


def test_replay_of_a_missing_bag_fails_naming_the_argument(launch):
    run = launch('uq_sim_bringup', 'replay.launch.py', 'bag:=/nonexistent/bag',
                 'ask_for_help:=false')
    assert run.finish(timeout_s=60) != 0, run.output
    assert "launch argument 'bag'" in run.output, run.output
    assert 'process started' not in run.output


@pytest.mark.slow
def test_a_killed_detector_is_respawned_and_activated_again(launch):
    run = launch('uq_bringup', 'uq_stack.launch.py', 'ask_for_help:=false',
                 'respawn_delay:=1.0', 'namespace:=respawn_test')
    assert run.wait_for(r'detector_node is active'), run.output
    pid = int(re.search(r'\[detector_node-\d+\]: process started with pid \[(\d+)\]',
                        run.output).group(1))
    os.kill(pid, signal.SIGKILL)
    # launch reports the death, starts a new process and the events activate it again.
    assert run.wait_for(r'\[detector_node-\d+\]: process has died'), run.output
    assert run.wait_for(r'\[detector_node-\d+\]: process started with pid', count=2), run.output
    assert run.wait_for(r'detector_node is active', count=2), run.output
    assert run.interrupt() == 0, run.output
    assert 'process has finished cleanly' in run.output


@pytest.mark.slow
def test_sim_launch_publishes_detections_of_the_rendered_scene(launch, tmp_path):
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    from uq_msgs.msg import DetectionArray

    # A copy of config/ whose sim camera has a frame_id of its own: seen on the detections,
    # it shows the parameter file reached the camera node in its namespace.
    config = tmp_path / 'config'
    shutil.copytree(WORKSPACE / 'config', config)
    camera = yaml.safe_load((config / 'sim_camera.yaml').read_text(encoding='utf-8'))
    camera['sim_camera_node']['ros__parameters']['frame_id'] = 'sim_launch_test_frame'
    (config / 'sim_camera.yaml').write_text(yaml.safe_dump(camera), encoding='utf-8')
    run = launch('uq_sim_bringup', 'sim.launch.py', 'scenario:=known_static', 'rate_hz:=5.0',
                 'ask_for_help:=false', 'namespace:=sim_test', f'config_dir:={config}')
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    received: list[DetectionArray] = []
    try:
        node = rclpy.create_node('sim_launch_probe', namespace='sim_test', context=context)
        node.create_subscription(DetectionArray, 'detections', received.append,
                                 QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline and sum(bool(m.detections) for m in received) < 5:
            executor.spin_once(timeout_sec=0.2)
            assert run.process.poll() is None, run.output
        assert sum(bool(m.detections) for m in received) >= 5, run.output
        assert all(m.header.frame_id == 'sim_launch_test_frame' for m in received)
    finally:
        context.try_shutdown()
    assert run.interrupt() == 0, run.output
    assert run.output.count('process has finished cleanly') >= 3, run.output


@pytest.mark.slow
def test_sim_closed_loop_runs_the_demo_graph_and_its_trial(launch):
    import json

    import rclpy
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    run = launch('uq_sim_bringup', 'sim.launch.py', 'closed_loop:=true', 'namespace:=loop_test',
                 'seed:=0', 'lookalike:=no')
    nodes = {'sim_robot_node', 'reach_policy_node', 'scripted_operator_node',
             'scripted_labeller_node', 'detector_node', 'arbitration_node', 'ask_for_help_node'}
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    states: list[dict] = []
    try:
        node = rclpy.create_node('closed_loop_probe', namespace='loop_test', context=context)
        node.create_subscription(String, 'task_state', lambda m: states.append(json.loads(m.data)),
                                 QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                                            durability=DurabilityPolicy.TRANSIENT_LOCAL))
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + 240.0
        while time.monotonic() < deadline and not (states and states[-1]['status'] != 'running'):
            executor.spin_once(timeout_sec=0.2)
            assert run.process.poll() is None, run.output
        assert states and states[-1]['status'] == 'success', (states[-1:], run.output[-3000:])
        present = {name for name, ns in node.get_node_names_and_namespaces()
                   if ns == '/loop_test'}
        assert nodes <= present, sorted(nodes - present)
        # The robot is the only camera: one publisher on image, none of sim_camera_node.
        assert node.count_publishers('/loop_test/image') == 1
        assert 'sim_camera_node' not in present
    finally:
        context.try_shutdown()
    assert run.interrupt() == 0, run.output
    assert run.output.count('process has finished cleanly') >= len(nodes), run.output


def test_the_robot_profile_reaches_the_nodes_in_a_namespace(launch):
    import rclpy
    from rcl_interfaces.srv import GetParameters
    from rclpy.parameter import parameter_value_to_python

    run = launch('uq_bringup', 'uq_stack.launch.py', 'profile:=robot', 'namespace:=robot_ns',
                 'ask_for_help:=false', 'autostart:=false')
    checks = {  # config/robot values that differ from the sim profile and the defaults
        'detector_node': {'torch_threads': 2, 'stale_input_timeout': 1.0},
        'arbitration_node': {'perception_deadline_s': 0.3,
                             'thresholds.calibrated_score.down': [0.97, 0.95, 0.92]},
    }
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    try:
        node = rclpy.create_node('robot_profile_probe', context=context)
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        for target, expected in checks.items():
            client = node.create_client(GetParameters, f'/robot_ns/{target}/get_parameters')
            assert client.wait_for_service(timeout_sec=120.0), run.output
            future = client.call_async(GetParameters.Request(names=list(expected)))
            executor.spin_until_future_complete(future, timeout_sec=30.0)
            values = [parameter_value_to_python(v) for v in future.result().values]
            for (name, want), got in zip(expected.items(), values, strict=True):
                got = list(got) if isinstance(want, list) else got
                assert got == pytest.approx(want), f'{target} {name}: {got!r}'
    finally:
        context.try_shutdown()
    assert run.interrupt() == 0, run.output


@pytest.mark.slow
def test_replay_launch_answers_every_frame_of_a_bag_then_ends(launch, tmp_path):
    uq = shutil.which('uq') or str(WORKSPACE / 'install' / 'uq_common' / 'bin' / 'uq')
    for command in (['replay', '--help'], ['sim', 'record', '--help']):
        if subprocess.run([uq, *command], capture_output=True, timeout=120).returncode != 0:
            pytest.skip(f'`uq {" ".join(command[:-1])}` is not installed')
    bag, out = tmp_path / 'bag', tmp_path / 'out'
    subprocess.run([uq, 'sim', 'record', '--scenario', 'known_static', '--out', str(bag),
                    '--duration', '3', '--rate', '10', '--no-progress'], check=True,
                   capture_output=True, timeout=300, env=dict(os.environ, MUJOCO_GL='egl'))
    # At the bag's own rate: the replay holds each image until the previous one is answered,
    # so a detector slowed down by a loaded machine is not sent frames it would drop.
    run = launch('uq_sim_bringup', 'replay.launch.py', f'bag:={bag}', 'ask_for_help:=false',
                 f'replay_args:=--record {out}')
    # The launch ends by itself when the replay ends (shutdown_at_end), every node cleanly.
    assert run.finish(timeout_s=300) == 0, run.output
    assert run.output.index('detector_node is active') < run.output.index('uq_replay'), \
        'the replay started before the detector was active'
    assert 'answered 30 of 30 images' in run.output, run.output
    recorded = re.search(r"recorded into .*\{'detections': (\d+)", run.output)
    assert recorded and int(recorded.group(1)) == 30, run.output
    assert run.output.count('process has finished cleanly') >= 3, run.output
