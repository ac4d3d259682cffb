"""Camera-sized images between processes over Fast DDS with the shipped profile.

A 1280x720 rgb8 stream (2.6 MiB a frame) at 15 Hz, best-effort as a camera driver publishes
it, goes from one process to a subscriber in another, both started with the workspace's
``config/dds/fastdds_large_images.xml`` (what ``scripts/env.sh`` exports). Every frame must
arrive: with Fast DDS's default 512 KiB shared-memory segment most of them are lost
(docs/dds.md gives the figures of ``scripts/dds_image_probe.py``, which runs both processes
here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / 'scripts' / 'dds_image_probe.py'
PROFILE = REPO / 'config' / 'dds' / 'fastdds_large_images.xml'
WIDTH, HEIGHT, RATE_HZ, FRAMES = 1280, 720, 15.0, 45


def test_1280x720_stream_reaches_another_process_at_15_hz():
    assert PROFILE.is_file()
    result = subprocess.run(
        [sys.executable, str(PROBE), '--width', str(WIDTH), '--height', str(HEIGHT),
         '--frames', str(FRAMES), '--rate', str(RATE_HZ), '--profile', str(PROFILE),
         '--domain-id', str(100 + zlib.crc32(__name__.encode()) % 100)],
        capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report['sent'] == FRAMES, report
    missing = sorted(set(range(1, FRAMES + 1)) - set(report['received']))
    assert not missing, f'{len(missing)} of {FRAMES} frames lost: {missing}'
