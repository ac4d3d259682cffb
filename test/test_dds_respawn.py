"""A subscriber process killed with SIGKILL and started again gets the camera's images again,
over Fast DDS with the shipped profile.

The respawned process takes the dead one's shared-memory port number; the publisher must find
the dead port and reach the new one (docs/dds.md, "The shipped profile"). Two kills, timed by
``scripts/dds_respawn_probe.py``, which runs both processes here; every restart must receive
images, well within the probe's 30 s wait (the docs give its times on a quiet machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / 'scripts' / 'dds_respawn_probe.py'
PROFILE = REPO / 'config' / 'dds' / 'fastdds_large_images.xml'
RUNS = 2
# A restart on a loaded 2-core machine: Python, rclpy and discovery, with a wide margin.
FIRST_IMAGE_BOUND_S = 15.0


def test_a_killed_subscriber_receives_images_again_after_its_restart():
    result = subprocess.run(
        [sys.executable, str(PROBE), '--runs', str(RUNS), '--profile', str(PROFILE),
         '--domain-id', str(100 + zlib.crc32(__name__.encode()) % 100)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report['restarts']) == RUNS, report
    assert report['without_image'] == 0, report
    for restart in report['restarts']:
        assert restart['subscribed_s'] < restart['first_image_s'] < FIRST_IMAGE_BOUND_S, report


def test_the_probe_gives_up_when_no_image_comes(tmp_path):
    # Discovery to 127.0.0.1 only, and no multicast, so no initial peer: both processes run
    # but never meet, and the probe must say so once its wait is over instead of waiting on
    # the silent subscriber.
    deaf = tmp_path / 'no_discovery.xml'
    deaf.write_text(
        '<?xml version="1.0" encoding="UTF-8" ?>\n'
        '<dds xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles"><profiles>'
        '<participant profile_name="deaf" is_default_profile="true"><rtps><builtin>'
        '<metatrafficUnicastLocatorList><locator><udpv4><address>127.0.0.1</address>'
        '</udpv4></locator></metatrafficUnicastLocatorList>'
        '</builtin></rtps></participant></profiles></dds>\n')
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(PROBE), '--runs', '1', '--profile', str(deaf), '--wait', '3',
         '--domain-id', str(100 + zlib.crc32(b'test_dds_respawn.deaf') % 100)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert 'received no image in 3 s' in result.stderr, result.stderr
    # The wait, plus the two processes' start and their exit after SIGINT.
    assert time.monotonic() - started < 60


def test_the_probe_refuses_bad_arguments():
    for args in (['--runs', '0'], ['--rate', '0'], ['--respawn-delay', '-1'], ['--wait', '0'],
                 ['--profile', '/nonexistent/profile.xml']):
        result = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert 'error:' in result.stderr, (args, result.stderr)
