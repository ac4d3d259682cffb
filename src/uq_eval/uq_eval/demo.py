"""``uq demo`` (``make demo``): the simulated camera and the detector node over real DDS.

Runs the sim camera node and the detector node as two separate processes on a private
ROS domain, plays the scripted ``tabletop_demo`` scenario (known objects, then unknown
ones appearing, then the gripper reaching for one), records what the detector publishes
next to the simulator's ground truth, and writes to ``out/demo/``:

- ``overlay.gif``: the detector's uncertainty overlay, as an operator would see it;
- ``uncertainty.png``: each object's GP standard deviation over time;
- ``summary.md`` / ``summary.json``: detections, mean sigma of known vs unknown objects,
  OOD flag rates, class accuracy, latency.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[3]


def configure(parser: argparse.ArgumentParser) -> None:
    """Run the main demo: sim camera + detector node, results in out/demo/."""
    parser.add_argument('--out', type=Path, default=WORKSPACE / 'out' / 'demo',
                        help='output directory')
    parser.add_argument('--model', type=Path, default=WORKSPACE / 'models' / 'detector.pt')
    parser.add_argument('--gp', type=Path, default=WORKSPACE / 'models' / 'detector_gp.npz')
    parser.add_argument('--scenario', default='tabletop_demo', help='scripted scenario')
    parser.add_argument('--rate', type=float, default=10.0, help='camera rate, Hz')
    parser.add_argument('--duration', type=float, default=None,
                        help='seconds to record (default: the scenario length)')
    parser.add_argument('--domain-id', type=int, default=int(os.environ.get(
        'UQ_DEMO_DOMAIN_ID', '64')), help='ROS_DOMAIN_ID of the demo (kept private)')
    parser.set_defaults(run=run)


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    handle = log.open('w')
    return subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def run(args: argparse.Namespace) -> int:
    for path, what in ((args.model, 'detector weights'), (args.gp, 'GP artefact')):
        if not path.is_file():
            print(f'uq demo: {what} not found at {path}; see models/MODEL_CARD.md to '
                  'reproduce them', file=sys.stderr)
            return 2
    from uq_eval.demo_recorder import record_demo
    from uq_sim.scenario import get_scenario

    scenario = get_scenario(args.scenario)
    duration = args.duration or scenario.duration
    args.out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {'ROS_DOMAIN_ID': str(args.domain_id)}
    os.environ['ROS_DOMAIN_ID'] = str(args.domain_id)
    python = sys.executable
    print(f'[demo] starting detector node and sim camera ({args.scenario}, {duration:.0f} s '
          f'at {args.rate:g} Hz) on ROS domain {args.domain_id}; logs in {args.out}',
          flush=True)
    detector = _start([python, '-m', 'uq_perception.detector_node', '--ros-args',
                       '-p', 'autostart:=true', '-p', f'model_path:={args.model}',
                       '-p', f'gp_path:={args.gp}'], env, args.out / 'detector_node.log')
    camera = None
    try:
        def start_camera() -> None:
            nonlocal camera
            camera = _start([python, '-m', 'uq_sim.sim_camera_node', '--ros-args',
                             '-p', f'scenario:={args.scenario}', '-p', 'loop:=false',
                             '-p', f'rate_hz:={args.rate}'], env,
                            args.out / 'sim_camera_node.log')

        paths = record_demo(args.out, duration, start_camera,
                            processes=lambda: [p for p in (detector, camera) if p])
    finally:
        for process in (camera, detector):
            if process is not None:
                _stop(process)
    if paths is None:
        return 1
    print('[demo] results:')
    for name, path in paths.items():
        print(f'  {name:<8} {path}')
    print((args.out / 'summary.md').read_text())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog='uq demo', description=__doc__.split('\n\n')[0])
    configure(parser)
    args = parser.parse_args()
    return args.run(args)


if __name__ == '__main__':
    sys.exit(main())
