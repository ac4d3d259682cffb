"""The GPU extra (requirements/gpu.in + gpu-constraints.txt) resolves with pip's own
resolver against the real indexes (PyPI + pypi.nvidia.com) for this interpreter, so a
set that cannot be installed together (torch-tensorrt taking another torch, a TensorRT
version it does not accept) fails the suite. Skipped only when an index cannot be reached.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[1]
REQUIREMENTS = WORKSPACE / 'requirements'
INDEXES = ('pypi.org', 'pypi.nvidia.com')
NETWORK_ERRORS = ('NewConnectionError', 'Name or service not known', 'Temporary failure in '
                  'name resolution', 'Max retries exceeded', 'Could not fetch URL',
                  'ConnectTimeout', 'ReadTimeout', 'No route to host', 'URLError')


def _unreachable_index() -> str | None:
    for host in INDEXES:
        try:
            socket.create_connection((host, 443), timeout=10).close()
        except OSError as exc:
            return f'{host} ({exc})'
    return None


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REQUIREMENTS / 'gpu-constraints.txt').read_text().splitlines():
        line = line.split('#', 1)[0].strip()
        if line:
            name, version = line.split('==')
            pins[name.lower().replace('_', '-')] = version
    return pins


def test_constraints_pin_the_cpu_torch_and_one_tensorrt_family():
    pins = _pins()
    app_torch = [line for line in (REQUIREMENTS / 'app.in').read_text().splitlines()
                 if line.startswith('torch==')]
    assert app_torch == [f'torch=={pins["torch"]}']
    families = {name for name in pins if name.startswith(('tensorrt-cu12', 'tensorrt-cu13'))}
    assert len({name.split('-')[1] for name in families}) == 1, families


@pytest.mark.slow
def test_gpu_extra_resolves_against_the_real_indexes(tmp_path):
    unreachable = _unreachable_index()
    if unreachable:
        pytest.skip(f'index not reachable from this machine: {unreachable}; the GPU extra '
                    'is resolved where PyPI and pypi.nvidia.com are')
    report = tmp_path / 'report.json'
    # The machine's pip configuration (a torch cap, local wheel folders) must not decide
    # the answer: --isolated ignores it and the environment, PIP_CONFIG_FILE too.
    env = {k: v for k, v in os.environ.items() if not k.startswith('PIP_')}
    env['PIP_CONFIG_FILE'] = os.devnull
    command = [sys.executable, '-m', 'pip', '--isolated', 'install', '--dry-run',
               '--ignore-installed', '--quiet', '--report', str(report),
               '--retries', '1', '--timeout', '30',
               '--index-url', 'https://pypi.org/simple',
               '--extra-index-url', 'https://pypi.nvidia.com',
               '-r', str(REQUIREMENTS / 'gpu.in'),
               '-c', str(REQUIREMENTS / 'gpu-constraints.txt')]
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.skip('pip did not answer within 240 s (index too slow to reach)')
    if result.returncode != 0:
        output = result.stdout + result.stderr
        if any(marker in output for marker in NETWORK_ERRORS) and 'ResolutionImpossible' \
                not in output and 'conflict' not in output.lower():
            pytest.skip(f'index not reachable: {output[-500:]}')
        pytest.fail(f'the GPU extra does not resolve:\n{output[-4000:]}')
    resolved = {item['metadata']['name'].lower().replace('_', '-'):
                item['metadata']['version'] for item in json.loads(report.read_text())['install']}
    for name, version in _pins().items():
        assert resolved.get(name) == version, (name, resolved.get(name))
    assert not {'tensorrt-cu12', 'tensorrt-cu12-libs'} & set(resolved)
