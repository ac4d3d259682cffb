"""Camera fault requests of the sim robot node (ROS-free)."""

import pytest

from uq_sim.sensor_faults import FaultRequest, parse_fault_request


def test_valid_fault_requests():
    assert parse_fault_request('{"camera_stop_s": 2}') == FaultRequest(camera_stop_s=2.0)
    assert parse_fault_request('{"corrupt_frames": 15}') == FaultRequest(corrupt_frames=15)


@pytest.mark.parametrize('text, match', [
    ('{}', 'exactly one'), ('{"camera_stop_s": 1, "corrupt_frames": 2}', 'exactly one'),
    ('{"camera_stop_s": 1, "pad": 0}', 'exactly one'),
    ('{"camera_stop_s": 0}', 'camera_stop_s'), ('{"camera_stop_s": 61}', 'camera_stop_s'),
    ('{"camera_stop_s": true}', 'camera_stop_s'), ('{"camera_stop_s": NaN}', 'JSON allows'),
    ('{"corrupt_frames": 0}', 'corrupt_frames'), ('{"corrupt_frames": 2.0}', 'corrupt_frames'),
    ('{"corrupt_frames": 101}', 'corrupt_frames'), ('[1]', 'JSON object'),
    ('{"corrupt_frames": 1, "x": "' + 'y' * 300 + '"}', 'characters long'),
])
def test_a_malformed_fault_request_is_refused_by_rule(text, match):
    with pytest.raises(ValueError, match=match):
        parse_fault_request(text)
