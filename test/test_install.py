"""A normal install (``colcon build`` without ``--symlink-install``, as on a robot or in a
Docker image) finds the shipped model: the detector node started from it configures with
the model files installed in ``share/uq_perception/models``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_detector_node_from_a_copy_install_finds_the_shipped_model(tmp_path):
    colcon = shutil.which('colcon')
    if colcon is None or not (REPO / 'install' / 'setup.bash').exists():
        pytest.skip('needs the workspace environment (make setup; source scripts/env.sh)')
    base = tmp_path / 'ws'
    # uq_msgs comes from the workspace's own install (an underlay), so only the Python
    # packages the node needs are built here, copied, not linked.
    build = subprocess.run(
        [colcon, '--log-base', str(base / 'log'), 'build', '--base-paths', str(REPO / 'src'),
         '--packages-select', 'uq_common', 'uq_perception',
         '--build-base', str(base / 'build'), '--install-base', str(base / 'install'),
         '--event-handlers', 'console_cohesion-', 'status-'],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    installed = base / 'install' / 'uq_perception' / 'share' / 'uq_perception' / 'models'
    model = installed / 'detector.pt'
    assert model.is_file() and not model.is_symlink()

    # Started from elsewhere, with the copy install overlaid and no model parameter.
    script = (f'source {REPO}/install/setup.bash && '
              f'source {base}/install/local_setup.bash && '
              f'exec {base}/install/uq_perception/lib/uq_perception/detector_node '
              '--ros-args -p autostart:=true')
    env = {k: v for k, v in os.environ.items() if k != 'UQ_MODEL_DIR'}
    env['ROS_DOMAIN_ID'] = '61'
    proc = subprocess.Popen(['bash', '-c', script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
                            start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if 'active: processing images' in line:
                break
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    output = ''.join(lines)
    # The default CPU backend: the shipped model's ONNX export agrees with torch.
    assert f'from {model} on onnxruntime' in output, output
    assert 'active: processing images' in output, output
