"""The grasp task in closed loop: the whole graph as separate processes over DDS.

:class:`ClosedLoop` starts, on a private ROS domain, one process per node:
``sim_robot_node`` (robot, camera, task judge), ``detector_node``, ``arbitration_node``,
``reach_policy_node`` (autonomy), ``scripted_operator_node`` (the person) and, when its
executable is installed, ``ask_for_help_node``; the caller may add the scripted labeller
(:data:`LABELLER`). All read ``config/shared_autonomy.yaml``, the ask-for-help node and the
labeller on top of their own files, as the launch files start them. The arbitrated
``cmd_vel`` drives the robot. :class:`LoopObserver` is the harness's own rclpy node: it
starts trials (``reset_task``), pins levels through the override service, and samples the
loop at ``sample_hz`` into :class:`TimelineSample` rows.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from uq_common.spin_thread import SpinThread

WORKSPACE = Path(__file__).resolve().parents[4]
CONFIG = WORKSPACE / 'config' / 'shared_autonomy.yaml'
# Nodes whose own parameter file is read before CONFIG, so the loop's sections override it.
NODE_CONFIGS = {'ask_for_help_node': WORKSPACE / 'config' / 'ask_for_help.yaml',
                'scripted_labeller_node': WORKSPACE / 'config' / 'scripted_labeller.yaml'}
# Lines each node logs once it is up (ClosedLoop.wait_for_output).
READY_LINES = {'detector_node': 'active: processing images',
               'ask_for_help_node': 'asking for help',
               'scripted_labeller_node': 'answering help requests'}

# (name, python module); ask_for_help_node is optional (its package may not have it yet).
NODES = (
    ('sim_robot_node', 'uq_sim.sim_robot_node'),
    ('detector_node', 'uq_perception.detector_node'),
    ('arbitration_node', 'uq_autonomy.arbitration_node'),
    ('reach_policy_node', 'uq_autonomy.reach_policy_node'),
    ('scripted_operator_node', 'uq_sim.scripted_operator_node'),
)
OPTIONAL_NODES = (('ask_for_help_node', 'uq_autonomy.ask_for_help_node'),)
# The person who answers help requests with the ground truth; started by the harness.
LABELLER = ('scripted_labeller_node', 'uq_sim.scripted_labeller_node')


def help_node_args(store: Path) -> list[str]:
    """The ask-for-help node's arguments in a harness: its labels in ``store`` and no page
    (it must neither write the user's label store nor take the page's port)."""
    return ['-p', f'label_store_url:={store}', '-p', 'web_enabled:=false']


def labeller_args(answer_delay_s: float) -> list[str]:
    """The scripted labeller's arguments: it answers after ``answer_delay_s`` seconds."""
    return ['-p', f'answer_delay_s:={float(answer_delay_s)}']


def _module_exists(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class ClosedLoop:
    """The node processes of the loop; a context manager that stops them on exit."""

    def __init__(self, log_dir: Path, domain_id: int, config: Path = CONFIG,
                 extra_args: dict[str, list[str]] | None = None,
                 with_optional: bool = True) -> None:
        self.log_dir = Path(log_dir)
        self.domain_id = domain_id
        self.config = config
        self.extra_args = {'ask_for_help_node': help_node_args(self.log_dir / 'labels.sqlite3'),
                           **(extra_args or {})}
        self.nodes = list(NODES) + [n for n in OPTIONAL_NODES
                                    if with_optional and _module_exists(n[1])]
        self.processes: dict[str, subprocess.Popen] = {}
        self._logs: list = []
        # Where each node's log stood when it was last started: wait_for_output reads on.
        self._log_offsets: dict[str, int] = {}

    def __enter__(self) -> ClosedLoop:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name, module in self.nodes:
            self.start(name, module)
        return self

    def restart(self, name: str, extra_args: list[str]) -> None:
        """Stop node ``name`` (SIGINT) and start it again with ``extra_args``."""
        self.stop(name)
        self.extra_args[name] = list(extra_args)
        self.start(name, dict(self.nodes)[name])

    def stop(self, name: str) -> None:
        """Stop node ``name`` (SIGINT; SIGKILL after 10 s); it leaves :attr:`processes`, so
        :meth:`dead` does not count it."""
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def start(self, name: str, module: str) -> None:
        """Start (or restart) one node process; a node not in :attr:`nodes` joins them."""
        if name not in dict(self.nodes):
            self.nodes.append((name, module))
        # Unbuffered: wait_for_output reads the log while the node runs.
        env = os.environ | {'ROS_DOMAIN_ID': str(self.domain_id), 'PYTHONUNBUFFERED': '1'}
        path = self.log_dir / f'{name}.log'
        log = path.open('a')
        self._logs.append(log)
        self._log_offsets[name] = path.stat().st_size
        # A harness's detector starts from the shipped GP in every run: what it learns stays
        # in memory, never in the user's learnt state under the ROS home (the caller's
        # arguments, after it, may still say otherwise).
        own = ['-p', 'persist_learnt_state:=false'] if name == 'detector_node' else []
        own_file = ['--params-file', str(NODE_CONFIGS[name])] if name in NODE_CONFIGS else []
        command = [sys.executable, '-m', module, '--ros-args', *own_file, '--params-file',
                   str(self.config), *own, *self.extra_args.get(name, [])]
        self.processes[name] = subprocess.Popen(command, env=env, stdout=log,
                                                stderr=subprocess.STDOUT)

    def wait_for_output(self, name: str, needle: str, timeout: float) -> bool:
        """Wait until node ``name`` has logged ``needle`` since its last start; False when
        it exits first or ``timeout`` seconds pass."""
        path, offset = self.log_dir / f'{name}.log', self._log_offsets[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with path.open('rb') as log:
                log.seek(offset)
                if needle in log.read().decode(errors='replace'):
                    return True
            if self.processes[name].poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def kill(self, name: str) -> None:
        """SIGKILL one node (fault injection) and reap it."""
        process = self.processes[name]
        process.kill()
        process.wait(timeout=10)

    def dead(self) -> list[str]:
        """Names of nodes that have exited."""
        return [n for n, p in self.processes.items() if p.poll() is not None]

    def __exit__(self, *exc: object) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10.0
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        for log in self._logs:
            log.close()


@dataclass
class TimelineSample:
    """The loop at one instant (harness steady clock, seconds)."""

    t: float
    trial: int
    status: str
    elapsed: float
    level: int
    uncertainty: float
    blend_alpha: float
    stale: bool
    operator_speed: float
    autonomy_speed: float
    cmd_speed: float
    gripper_x: float
    gripper_y: float
    help_requests: int
    # The arbitration's suspect gate: the level held at guided for a suspect driving track,
    # and that track's score (-1 when it has none, NaN without usable perception).
    suspect_hold: bool = False
    track_score: float = math.nan


class LoopObserver:
    """The harness's node: starts trials, pins levels, samples the loop.

    Spins in a background thread; every public method is safe to call from the caller's
    thread.
    """

    def __init__(self, sample_hz: float = 20.0) -> None:
        import rclpy
        from geometry_msgs.msg import PoseStamped, Twist
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
        from std_msgs.msg import String

        from uq_msgs.msg import AutonomyState
        from uq_msgs.srv import SetAutonomyOverride

        self._rclpy = rclpy
        self._srv_type = SetAutonomyOverride
        self._string = String
        from rclpy.signals import SignalHandlerOptions

        self.context = rclpy.Context()
        # No rclpy signal handlers: Ctrl-C must reach the harness (KeyboardInterrupt) so
        # that it stops the node processes it started.
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node('closed_loop_observer', context=self.context)
        latched = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                             reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        best_effort = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                                 reliability=ReliabilityPolicy.BEST_EFFORT,
                                 durability=DurabilityPolicy.VOLATILE)
        reliable = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                              reliability=ReliabilityPolicy.RELIABLE,
                              durability=DurabilityPolicy.VOLATILE)
        self._lock = threading.Lock()
        self.task: dict = {}
        self.level, self.uncertainty, self.alpha, self.stale = 0, math.nan, 0.0, True
        self.suspect_hold, self.track_score = False, math.nan
        self.level_events: list[tuple[float, int, str]] = []
        self.help_events: list[float] = []
        self.speeds = {'operator': 0.0, 'autonomy': 0.0, 'cmd': 0.0}
        self.gripper = (math.nan, math.nan)
        self.samples: list[TimelineSample] = []
        self.recording = False
        n = self.node
        n.create_subscription(String, 'task_state', self._on_task, latched)
        n.create_subscription(AutonomyState, 'autonomy_state', self._on_state, latched)
        n.create_subscription(PoseStamped, 'robot_pose', self._on_pose, reliable)
        for key, topic, qos in (('operator', 'operator/cmd_vel', best_effort),
                                ('autonomy', 'autonomy/cmd_vel', best_effort),
                                ('cmd', 'cmd_vel', reliable)):
            n.create_subscription(Twist, topic, self._speed_setter(key), qos)
        try:
            from uq_msgs.msg import HelpRequest
            n.create_subscription(HelpRequest, 'help_request', self._on_help, reliable)
        except ImportError:
            pass
        self._reset_pub = n.create_publisher(String, 'reset_task', reliable)
        self._fault_pub = n.create_publisher(String, 'sim_fault', reliable)
        self._override = n.create_client(SetAutonomyOverride, 'set_autonomy_override')
        n.create_timer(1.0 / sample_hz, self._sample)
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(n)
        self._spinner = SpinThread(self._executor, name='loop_observer')

    # --- callbacks -------------------------------------------------------------------
    def _on_task(self, msg) -> None:
        try:
            task = json.loads(msg.data)
        except ValueError:
            return
        with self._lock:
            self.task = task

    def _on_state(self, msg) -> None:
        with self._lock:
            if msg.level != self.level or not self.level_events:
                self.level_events.append((time.monotonic(), int(msg.level), msg.reason))
            self.level, self.uncertainty = int(msg.level), float(msg.uncertainty)
            self.alpha, self.stale = float(msg.blend_alpha), bool(msg.perception_stale)
            # An AutonomyState from before the suspect gate has neither field.
            self.suspect_hold = bool(getattr(msg, 'suspect_hold', False))
            self.track_score = float(getattr(msg, 'track_score', math.nan))

    def _on_pose(self, msg) -> None:
        with self._lock:
            self.gripper = (msg.pose.position.x, msg.pose.position.y)

    def _on_help(self, msg) -> None:
        with self._lock:
            self.help_events.append(time.monotonic())

    def _speed_setter(self, key: str):
        def setter(msg) -> None:
            with self._lock:
                self.speeds[key] = math.hypot(msg.linear.x, msg.linear.y)
        return setter

    def _sample(self) -> None:
        with self._lock:
            if not self.recording:
                return
            self.samples.append(TimelineSample(
                time.monotonic(), int(self.task.get('trial', -1)),
                str(self.task.get('status', '')), float(self.task.get('elapsed_s', -1.0)),
                self.level, self.uncertainty, self.alpha,
                self.stale, self.speeds['operator'], self.speeds['autonomy'],
                self.speeds['cmd'], *self.gripper, len(self.help_events),
                self.suspect_hold, self.track_score))

    # --- control ---------------------------------------------------------------------
    def wait_for(self, predicate, timeout: float, period: float = 0.05) -> bool:
        """Poll ``predicate()`` until true or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if predicate():
                    return True
            time.sleep(period)
        return False

    def wait_until_ready(self, timeout: float) -> bool:
        """Wait for the task state and for usable perception (the detector is up)."""
        return self.wait_for(lambda: bool(self.task) and bool(self.level_events)
                             and not self.stale, timeout)

    def set_level(self, level: int, timeout: float = 30.0) -> bool:
        """Pin the level (``-1`` releases) through ``set_autonomy_override``."""
        if not self._override.wait_for_service(timeout_sec=timeout):
            return False
        request = self._srv_type.Request(level=level)
        future = self._override.call_async(request)
        deadline = time.monotonic() + timeout
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        return future.done() and future.result().success

    def start_trial(self, seed: int, lookalike: bool | None, request_id: int,
                    extra: dict | None = None) -> None:
        """Ask the sim for trial ``seed``, tagged ``request_id``; ``extra`` adds fields of
        the reset request (look-alike shape, target absent, time limit)."""
        payload = json.dumps({'seed': int(seed), 'lookalike': lookalike,
                              'request_id': int(request_id), **(extra or {})})
        self._reset_pub.publish(self._string(data=payload))

    def camera_fault(self, fault: dict) -> None:
        """Inject a camera fault (``uq_sim.sensor_faults``) into the running trial."""
        self._fault_pub.publish(self._string(data=json.dumps(fault)))

    def perception_fresh(self) -> bool:
        """Whether the arbitration node last reported usable perception."""
        with self._lock:
            return not self.stale

    def trial_state(self) -> dict:
        """The latest task state."""
        with self._lock:
            return dict(self.task)

    def take_samples(self) -> list[TimelineSample]:
        """Samples recorded since the last call."""
        with self._lock:
            samples, self.samples = self.samples, []
        return samples

    def close(self) -> None:
        """Stop spinning and shut the node's context down."""
        self._spinner.stop()
        self._executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        self._rclpy.shutdown(context=self.context)


def run_trial(observer: LoopObserver, seed: int, lookalike: bool | None,
              timeout: float, extra: dict | None = None,
              fault: tuple[float, Callable[[], None]] | None = None
              ) -> tuple[dict, list[TimelineSample]]:
    """Run trial ``seed`` to its end; returns its final task state and timeline.

    ``extra`` adds fields to the reset request. ``fault`` is ``(at_s, inject)``: ``inject()``
    is called once, when the trial has run ``at_s`` seconds; the state then carries
    ``fault_onset`` (the harness's steady clock, as the samples' ``t``).
    """
    observer.take_samples()
    with observer._lock:
        observer.recording = True
    sent = time.monotonic()
    request_id = int(sent * 1000) % 2**31
    observer.start_trial(seed, lookalike, request_id, extra)

    def ours() -> bool:
        return observer.task.get('request_id') == request_id

    if not observer.wait_for(ours, 10.0):
        # The reset may have been lost while the sim was busy: send it once more.
        observer.start_trial(seed, lookalike, request_id, extra)
    onset = None
    if fault is not None:
        at_s, inject = fault
        if observer.wait_for(lambda: ours() and (observer.task.get('status') != 'running' or
                                                 observer.task.get('elapsed_s', 0.0) >= at_s),
                             timeout + 15.0) and observer.trial_state().get('status') == 'running':
            onset = time.monotonic()
            inject()
    ended = observer.wait_for(lambda: ours() and observer.task.get('status') != 'running',
                              timeout + 15.0)
    with observer._lock:
        observer.recording = False
    state = observer.trial_state()
    if not ended:
        state = dict(state, status='harness_timeout', trial=seed,
                     elapsed_s=time.monotonic() - sent)
    if onset is not None:
        state['fault_onset'] = onset
    return state, observer.take_samples()

