"""Camera faults injected into the sim robot's camera mid-trial (ROS-free).

A ``sim_fault`` request is a JSON object with one of:

- ``{"camera_stop_s": S}``: no image or camera_info for ``S`` seconds (0 < S <= 60) while
  the gripper keeps moving, as a stalled driver or a pulled cable;
- ``{"corrupt_frames": N}``: the next ``N`` frames (1 <= N <= 100) go out with their pixel
  buffer cut to half its declared length, as a driver that sends torn frames.
"""

from __future__ import annotations

from dataclasses import dataclass

from uq_common.json_text import parse_json_object

MAX_FAULT_REQUEST_CHARS = 256
MAX_CAMERA_STOP_S = 60.0
MAX_CORRUPT_FRAMES = 100


@dataclass(frozen=True)
class FaultRequest:
    """One fault: seconds of camera silence, or a number of corrupt frames (the other 0)."""

    camera_stop_s: float = 0.0
    corrupt_frames: int = 0


def parse_fault_request(text: str) -> FaultRequest:
    """The fault in ``text`` (see the module docstring).

    Raises
    ------
    ValueError
        Naming the first rule ``text`` breaks: too long, not a JSON object, not exactly one
        of the two keys, a value of the wrong type or out of range.
    """
    request = parse_json_object(text, 'fault request', MAX_FAULT_REQUEST_CHARS)
    keys = set(request) & {'camera_stop_s', 'corrupt_frames'}
    if len(keys) != 1 or len(request) != 1:
        raise ValueError(f'a fault request holds exactly one of camera_stop_s, corrupt_frames;'
                         f' got keys {sorted(request)!r:.80}')
    if 'camera_stop_s' in request:
        stop = request['camera_stop_s']
        if isinstance(stop, bool) or not isinstance(stop, int | float) \
                or not 0.0 < stop <= MAX_CAMERA_STOP_S:
            raise ValueError(f'camera_stop_s must be a number in (0, {MAX_CAMERA_STOP_S:g}], '
                             f'got {stop!r:.40}')
        return FaultRequest(camera_stop_s=float(stop))
    count = request['corrupt_frames']
    if isinstance(count, bool) or not isinstance(count, int) \
            or not 1 <= count <= MAX_CORRUPT_FRAMES:
        raise ValueError(f'corrupt_frames must be an integer in [1, {MAX_CORRUPT_FRAMES}], '
                         f'got {count!r:.40}')
    return FaultRequest(corrupt_frames=count)
