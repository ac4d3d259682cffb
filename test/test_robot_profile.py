"""The robot parameter profile (config/robot/) is accepted by the real nodes.

Each node of the profile is started as its own process the way ``uq_stack.launch.py
profile:=robot`` and the profile's header start it (the sim file, then the robot file on
top), over real DDS on a private domain; the test reads the parameters back through the
node's parameter services and compares them with the files, then stops the node with
SIGINT and expects exit code 0. A robot value the node refused (range, ordering, unknown
name) would end the process at start-up; a misspelt name the node does not declare would be
silently ignored, so every robot key must be one of the node's parameters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import rclpy
import yaml
from rcl_interfaces.srv import GetParameters, ListParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import parameter_value_to_python

WORKSPACE = Path(__file__).resolve().parents[1]
CONFIG = WORKSPACE / 'config'
DOMAIN_ID = 100 + zlib.crc32(b'test_robot_profile') % 100
NODES = {  # node -> (package, parameters set on the command line for the test)
    'detector_node': ('uq_perception', {'autostart': False}),  # no model load needed
    'arbitration_node': ('uq_autonomy', {}),
    # No web server (its port may be taken on a shared machine), a label store of its own.
    'ask_for_help_node': ('uq_autonomy', {'web_enabled': False, 'label_store_url': '{tmp}'}),
}
ROBOT_FILES = sorted((CONFIG / 'robot').glob('*.yaml'))


def _flatten(params: dict[str, Any], prefix: str = '') -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f'{prefix}{key}.'))
        else:
            flat[f'{prefix}{key}'] = value
    return flat


def _parameters(path: Path, node: str) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding='utf-8')) or {}
    return _flatten(data.get(node, {}).get('ros__parameters', {}))


def test_every_robot_file_is_for_a_node_with_a_sim_file():
    assert ROBOT_FILES, 'config/robot/ holds no profile'
    for path in ROBOT_FILES:
        data = yaml.safe_load(path.read_text(encoding='utf-8'))
        (node,) = data.keys()
        assert node == f'{path.stem}_node', f'{path.name} configures {node}'
        assert (CONFIG / path.name).is_file(), f'no sim profile config/{path.name}'
        assert _parameters(path, node), f'{path.name} sets nothing'


def _call(executor, client, request, timeout_s: float = 30.0, attempt_s: float = 5.0):
    assert client.wait_for_service(timeout_sec=timeout_s), f'{client.srv_name} not available'
    # Listing and reading parameters are idempotent, so a response lost in DDS discovery
    # (uq_common.service_calls) is asked for again, after a few seconds rather than after a
    # third of the whole time-out: an answer comes in milliseconds once the service is
    # there, and a lost one cost the test 20 s.
    end = time.monotonic() + timeout_s
    while (left := end - time.monotonic()) > 0:
        future = client.call_async(request)
        executor.spin_until_future_complete(future, timeout_sec=min(attempt_s, left))
        if future.done():
            return future.result()
        client.remove_pending_request(future)
    raise AssertionError(f'{client.srv_name} did not answer')


@pytest.mark.parametrize('node_name', [p.stem + '_node' for p in ROBOT_FILES])
def test_the_node_starts_with_the_robot_profile_and_holds_its_values(node_name, tmp_path):
    package, overrides = NODES[node_name]
    overrides = {name: str(tmp_path / 'labels.sqlite3') if value == '{tmp}' else value
                 for name, value in overrides.items()}
    extra = [arg for name, value in overrides.items()
             for arg in ('-p', f'{name}:={yaml.safe_dump(value).splitlines()[0]}')]
    executable = WORKSPACE / 'install' / package / 'lib' / package / node_name
    assert executable.is_file(), f'{executable} not installed (make setup)'
    stem = node_name.removesuffix('_node')
    base, robot = CONFIG / f'{stem}.yaml', CONFIG / 'robot' / f'{stem}.yaml'
    expected = {**_parameters(base, node_name), **_parameters(robot, node_name), **overrides}
    process = subprocess.Popen(
        # Root namespace, as the files' `<node>:` keys require (uq_stack.launch.py rewrites
        # them to `/**/<node>` for other namespaces); the private domain isolates it.
        [str(executable), '--ros-args', '--params-file', str(base),
         '--params-file', str(robot), *extra],
        env=dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    try:
        probe = rclpy.create_node('robot_profile_probe', context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(probe)
        target = f'/{node_name}'
        listed = _call(executor, probe.create_client(ListParameters, f'{target}/list_parameters'),
                       ListParameters.Request(), timeout_s=60.0)
        assert process.poll() is None, process.communicate()[0]
        declared = set(listed.result.names)
        robot_names = set(_parameters(robot, node_name))
        assert robot_names <= declared, f'not parameters of {node_name}: ' \
                                        f'{sorted(robot_names - declared)}'
        names = sorted(expected)
        values = _call(executor, probe.create_client(GetParameters, f'{target}/get_parameters'),
                       GetParameters.Request(names=names)).values
        actual = {name: parameter_value_to_python(value)
                  for name, value in zip(names, values, strict=True)}
        for name in names:
            want, got = expected[name], actual[name]
            if isinstance(want, list | float):
                got_value = list(got) if isinstance(want, list) else got
                assert got_value == pytest.approx(want), f'{name}: {got!r} != {want!r}'
            else:
                assert got == want, f'{name}: {got!r} != {want!r}'
    finally:
        context.try_shutdown()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            output = process.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0]
    assert process.returncode == 0, output
