"""Ask-for-help node: persistent uncertainty becomes a labelling request; answers are stored
durably and taught to the detector.

Thin ROS 2 adapter around :class:`uq_autonomy.help.policy.HelpPolicy` (when to ask),
:class:`uq_autonomy.labels.store.LabelStore` (durable requests and labels) and
:mod:`uq_autonomy.labels.web` (the page a person answers on); docs/ask_for_help.md
describes the loop.

Subscribes
    ``detections`` (uq_msgs/DetectionArray, best-effort) and ``image`` (sensor_msgs/Image,
    best-effort): the last ``image_buffer`` images are kept by stamp, so a request's crop
    comes from the very frame its detection was made on. ``autonomy_state``
    (uq_msgs/AutonomyState): while the arbitration holds the hand-over because the
    autonomy's target track is suspect (``suspect_hold``), that track is asked about at once
    (``ask_before_hand_over``). Frames stamped more than
    ``max_future_stamp_s`` ahead of the node clock, images larger than the detector accepts
    and class names the label store would refuse are left out, counted in the diagnostics.
Publishes
    ``help_request`` (uq_msgs/HelpRequest, reliable + transient-local): each request with its
    crop, candidates and reason; ``/diagnostics``.
Serves
    ``provide_label`` (uq_msgs/ProvideLabel): the answers, from the web page, a CLI or
    another node. ``accepted`` means the label is stored durably (one transaction of the
    label store, an SQLite file or a PostgreSQL database shared by a fleet, as
    ``label_store_url`` says); the message says whether the detector has learnt it yet.
Calls
    ``teach_object`` (uq_msgs/TeachObject) of the detector with each stored label and its
    embedding; labels the detector has not acknowledged (it was down, or restarted, or its
    response was lost) are sent again every ``teach_retry_period_s`` until it has (the
    detector applies a label once).

A fleet shares one label store: each request carries this robot's ``robot_id``, and with
``learn_fleet_labels`` the node follows the store's change feed every
``fleet_poll_period_s`` and teaches its detector the answers given to every robot's
requests (docs/ask_for_help.md, "A fleet of robots").

The model's range comes with every frame (``DetectionArray.reference_variance_max``): a
signal the model cannot give (the calibrated score of a model without a score reference, a
``gp_variance_threshold`` far above its range) is reported with one error line naming the
parameter and the range, and an ERROR status on ``/diagnostics``; requests then come from
the detector's out-of-distribution flag alone (``ood_mode``), until the parameter is fixed.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.exceptions import InvalidServiceNameException
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.validate_topic_name import validate_topic_name
from sensor_msgs.msg import Image

from uq_autonomy.arbitration.config import (
    NO_CALIBRATED_SCORE,
    ArbiterConfig,
    ModelRange,
    UncertaintySignal,
    signal_problem,
)
from uq_autonomy.arbitration.frame_validity import future_stamp_problem
from uq_autonomy.help.crops import box_in_region, crop_region, cut, encode_png
from uq_autonomy.help.follow_up import FollowUpConfig, FollowUpTeacher
from uq_autonomy.help.policy import (
    Candidate,
    HelpDecision,
    HelpPolicy,
    HelpPolicyConfig,
    OodMode,
    TrackObservation,
)
from uq_autonomy.labels.store import (
    LabelRecord,
    LabelStoreBase,
    LabelStoreError,
    PendingRequest,
)
from uq_autonomy.labels.url import open_label_store, parse_store_url
from uq_autonomy.labels.validation import (
    LabelValidationError,
    validate_label,
    validate_labeler,
    validate_robot_id,
)
from uq_common.image_codec import (
    MAX_IMAGE_PIXELS,
    ImageFormatError,
    image_to_rgb,
    rgb_to_image_fields,
)
from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import ParameterSpec, declare_parameters, first_invalid
from uq_common.qos import HELP_REQUEST_QOS
from uq_common.service_calls import ResendingCalls
from uq_msgs.msg import AutonomyState, DetectionArray, HelpRequest
from uq_msgs.srv import ProvideLabel, TeachObject

NODE_NAME = 'ask_for_help_node'
# Bounds on hostile inputs: no camera has more pixels per side, no frame more detections.
MAX_PIXELS = 100_000.0
MAX_DETECTIONS = 1000
# Images buffered for the crops: at most the detector's default pixel cap, so every frame
# the detector processes can be cropped, and no more; the byte cap allows that many pixels
# of the widest encoding image_to_rgb reads (32FC3, 12 bytes).
MAX_IMAGE_BYTES = MAX_IMAGE_PIXELS * 12


def _labeler_problem(value: str) -> str | None:
    """Why ``value`` cannot be the labeler stored with answers (the label store's rule), so
    that a bad one is refused when set rather than failing every answer later."""
    try:
        validate_labeler(value)
    except LabelValidationError as exc:
        return str(exc)
    return None


def _robot_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be this robot's id in the label store."""
    try:
        validate_robot_id(value, allow_empty=False)
    except LabelValidationError as exc:
        return str(exc)
    return None


def _store_url_problem(value: str) -> str | None:
    """Why ``value`` names no label store."""
    try:
        parse_store_url(value)
    except ValueError as exc:
        return str(exc)
    return None


def default_robot_id() -> str:
    """This machine's host name (its first label), the default ``robot_id``."""
    name = socket.gethostname().split('.')[0]
    return name if _robot_id_problem(name) is None else 'robot'


def _service_name_problem(value: str) -> str | None:
    """Why ``value`` cannot name the detector's service (rclpy would raise at start-up)."""
    try:
        validate_topic_name(value, is_service=True)
    except InvalidServiceNameException as exc:
        return f'teach_service {value!r} is not a service name: ' \
               f'{str(exc).splitlines()[0].rstrip(":")}'
    return None


_DEFAULT = HelpPolicyConfig()
# Policy parameters map one to one onto HelpPolicyConfig fields.
POLICY_PARAMETERS = [
    ParameterSpec('signal', _DEFAULT.signal.value, 'Epistemic signal that earns a request.',
                  choices=[s.value for s in UncertaintySignal]),
    ParameterSpec('calibrated_score_threshold', _DEFAULT.calibrated_score_threshold,
                  'Calibrated score (fraction of the model\'s known validation objects less '
                  'uncertain) above which a frame counts as uncertain; the same for every '
                  'model.', min_value=0.0, max_value=1.0, constraints='< 1'),
    ParameterSpec('gp_variance_threshold', _DEFAULT.gp_variance_threshold,
                  'GP variance (logit^2, one model\'s unit) above which a frame counts as '
                  'uncertain (calibrate: docs/ask_for_help.md).', min_value=0.0,
                  max_value=1e6),
    ParameterSpec('mutual_information_threshold', _DEFAULT.mutual_information_threshold,
                  'Mutual information (nats) above which a frame counts as uncertain.',
                  min_value=0.0, max_value=100.0),
    ParameterSpec('window_frames', _DEFAULT.window_frames,
                  'M: frames of a track over which the evidence is counted.',
                  min_value=1, max_value=1000),
    ParameterSpec('min_frames_above', _DEFAULT.min_frames_above,
                  'N: frames of the last M above the threshold that earn a request.',
                  min_value=1, max_value=1000, constraints='<= window_frames'),
    ParameterSpec('ood_mode', _DEFAULT.ood_mode.value,
                  'What the detector\'s OOD flag does.', choices=[m.value for m in OodMode]),
    ParameterSpec('ood_min_frames', _DEFAULT.ood_min_frames,
                  'Flagged frames of the last M that earn a request (ood_mode trigger).',
                  min_value=1, max_value=1000, constraints='<= window_frames'),
    ParameterSpec('embedding_match_threshold', _DEFAULT.embedding_match_threshold,
                  'Cosine similarity above which a new track is the same object as one '
                  'already asked about.', min_value=-1.0, max_value=1.0),
    ParameterSpec('iou_match_threshold', _DEFAULT.iou_match_threshold,
                  'IoU for the same-object fallback without embeddings.',
                  min_value=0.0, max_value=1.0),
    ParameterSpec('requests_per_minute', _DEFAULT.requests_per_minute,
                  'Budget: requests per sliding minute.', min_value=0, max_value=10000),
    ParameterSpec('requests_per_hour', _DEFAULT.requests_per_hour,
                  'Budget: requests per sliding hour.', min_value=0, max_value=100000),
    ParameterSpec('cooldown_s', _DEFAULT.cooldown_s, 'Least time between two requests.',
                  min_value=0.0, max_value=86400.0),
    ParameterSpec('track_timeout_s', _DEFAULT.track_timeout_s,
                  'Tracks unseen for this long are forgotten.', min_value=0.01,
                  max_value=3600.0),
]
PARAMETERS = POLICY_PARAMETERS + [
    ParameterSpec('label_store_url', '',
                  'Label store: sqlite:///path (one robot), postgresql://user@host:port/db '
                  '(a fleet) or a file path; empty: $UQ_LABEL_STORE, else the user data '
                  'folder\'s SQLite file.', read_only=True, check=_store_url_problem),
    ParameterSpec('robot_id', default_robot_id(), 'This robot\'s id, stored with its requests '
                  '(default: the host name).', read_only=True, check=_robot_id_problem),
    ParameterSpec('learn_fleet_labels', True, 'Teach the detector the answers given to other '
                  'robots\' requests in a shared store (false: this robot\'s only).',
                  read_only=True),
    ParameterSpec('fleet_poll_period_s', 1.0, 'Seconds between two reads of the store\'s '
                  'new answers (other robots\', other labelling pages, imports).',
                  min_value=0.05, max_value=3600.0, read_only=True),
    ParameterSpec('image_buffer', 30, 'Images kept by stamp for the crops.',
                  min_value=1, max_value=1000, read_only=True),
    ParameterSpec('crop_margin', 0.25, 'Context around the box in a crop, as a fraction of '
                  'its size.', min_value=0.0, max_value=5.0),
    ParameterSpec('max_future_stamp_s', ArbiterConfig().max_future_stamp_s,
                  'A DetectionArray stamped further ahead of the node clock than this is '
                  'ignored (counted in the diagnostics).', min_value=0.001, max_value=3600.0),
    ParameterSpec('labeler', 'ros', 'Labeler name stored for answers that give none (1-64 '
                  'printable characters).', check=_labeler_problem),
    ParameterSpec('teach_service', 'teach_object', 'The detector\'s TeachObject service.',
                  read_only=True, check=_service_name_problem),
    ParameterSpec('teach_retry_period_s', 2.0, 'Seconds between attempts to teach the '
                  'detector labels it has not acknowledged.', min_value=0.1,
                  max_value=3600.0, read_only=True),
    ParameterSpec('follow_up_max', 3, 'After an answer, how many more embeddings of the '
                  'answered track are taught while it is still misclassified or uncertain '
                  '(0: off; docs/help_eval.md).', min_value=0, max_value=100,
                  read_only=True),
    ParameterSpec('follow_up_interval_s', 1.0, 'Least time between two follow-up teachings '
                  'of one track.', min_value=0.0, max_value=3600.0, read_only=True),
    ParameterSpec('ask_before_hand_over', True, 'Ask at once about the autonomy\'s target when '
                  'the arbitration holds the level at guided because the target track is '
                  'suspect (autonomy_state suspect_hold): "is this the ellipsoid?".'),
    ParameterSpec('web_enabled', True, 'Serve the labelling page.', read_only=True),
    ParameterSpec('web_host', '127.0.0.1', 'Address of the labelling page; anything but '
                  'loopback needs web_token.', read_only=True),
    ParameterSpec('web_port', 8765, 'Port of the labelling page (0: any free port).',
                  min_value=0, max_value=65535, read_only=True),
    ParameterSpec('web_token', '', 'Access token of the labelling page (empty: none, '
                  'loopback only).', read_only=True),
    ParameterSpec('diagnostics_period_s', 1.0, 'Period of the /diagnostics status.',
                  min_value=0.1, max_value=60.0, read_only=True),
]
_SPECS = {spec.name: spec for spec in PARAMETERS}

SENSOR_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=5,
                        reliability=ReliabilityPolicy.BEST_EFFORT,
                        durability=DurabilityPolicy.VOLATILE)
# The arbitration latches its state; the latest one is what counts.
AUTONOMY_STATE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                                reliability=ReliabilityPolicy.RELIABLE,
                                durability=DurabilityPolicy.TRANSIENT_LOCAL)


def policy_config(values: dict[str, Any]) -> HelpPolicyConfig:
    """The policy configuration from parameter values (ValueError naming a bad one)."""
    return HelpPolicyConfig(
        signal=UncertaintySignal(values['signal']),
        calibrated_score_threshold=values['calibrated_score_threshold'],
        gp_variance_threshold=values['gp_variance_threshold'],
        mutual_information_threshold=values['mutual_information_threshold'],
        window_frames=values['window_frames'], min_frames_above=values['min_frames_above'],
        ood_mode=OodMode(values['ood_mode']), ood_min_frames=values['ood_min_frames'],
        embedding_match_threshold=values['embedding_match_threshold'],
        iou_match_threshold=values['iou_match_threshold'],
        requests_per_minute=values['requests_per_minute'],
        requests_per_hour=values['requests_per_hour'], cooldown_s=values['cooldown_s'],
        track_timeout_s=values['track_timeout_s'])


def detection_problem(d: Any) -> str | None:
    """Why a detection cannot be evidence for a help request, or ``None`` when it can: the
    numbers the policy and the crop use must be finite and in range."""
    numbers = (d.center_x, d.center_y, d.width, d.height, d.score,
               d.uncertainty.gp_variance, d.uncertainty.mutual_information,
               d.uncertainty.calibrated_score)
    if not all(math.isfinite(v) for v in numbers):
        return 'non-finite box, score or uncertainty'
    score = d.uncertainty.calibrated_score
    if not (0.0 <= score <= 1.0 or score == NO_CALIBRATED_SCORE):
        return f'calibrated_score {score:g} neither in [0, 1] nor {NO_CALIBRATED_SCORE:g}'
    if d.width <= 0.0 or d.height <= 0.0 or max(abs(d.center_x), abs(d.center_y),
                                                   d.width, d.height) > MAX_PIXELS:
        return f'box {d.width:g}x{d.height:g} at ({d.center_x:g}, {d.center_y:g}) out of range'
    if d.uncertainty.gp_variance < 0.0 or d.uncertainty.mutual_information < 0.0:
        return 'negative uncertainty'
    if len(d.embedding):
        embedding = np.asarray(d.embedding, dtype=np.float64)
        if not np.isfinite(embedding).all() or float(np.abs(embedding).max()) > 1e6:
            return 'non-finite or out-of-range embedding'
    if not all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in d.class_probabilities):
        return 'class probabilities outside [0, 1]'
    return None


class _StoredLabels:
    """Class names of one message as the label store keeps them, each checked once: a
    request carries its detection's class and candidates, and one name the store refuses
    would fail the request each time the policy raised it."""

    def __init__(self) -> None:
        self._labels: dict[str, str | None] = {}
        self.refused: list[str] = []

    def label(self, name: str) -> str | None:
        """The stored form of ``name``, or ``None`` when the store refuses it (the reason is
        added to :attr:`refused`)."""
        if name not in self._labels:
            try:
                self._labels[name] = validate_label(name)
            except LabelValidationError as exc:
                self._labels[name] = None
                self.refused.append(f'{name!r:.80}: {exc}')
        return self._labels[name]


def observations(msg: DetectionArray) -> tuple[list[TrackObservation], list[str], list[str]]:
    """The policy's view of each valid detection (adapter, no logic), why the others were
    left out, and why class names were left out of them (the detection is kept)."""
    out, problems = [], []
    labels = _StoredLabels()
    for d in msg.detections:
        problem = detection_problem(d)
        if problem:
            problems.append(f'track {d.track_id}: {problem}')
            continue
        probabilities = list(d.class_probabilities)
        order = np.argsort(probabilities)[::-1][:3] if probabilities else []
        candidates = []
        for i in order:
            label = labels.label(msg.class_names[i]) if i < len(msg.class_names) else None
            if label is not None:
                candidates.append(Candidate(label, float(probabilities[i])))
        out.append(TrackObservation(
            track_id=d.track_id, class_index=d.class_index,
            class_name=(labels.label(d.class_id) or '') if d.class_id else '',
            gp_variance=d.uncertainty.gp_variance,
            mutual_information=d.uncertainty.mutual_information,
            calibrated_score=d.uncertainty.calibrated_score,
            out_of_distribution=d.uncertainty.out_of_distribution,
            box=(d.center_x, d.center_y, d.width, d.height),
            embedding=np.asarray(d.embedding, dtype=np.float32) if len(d.embedding) else None,
            candidates=tuple(candidates), score=d.score))
    return out, problems, labels.refused


def _stamp_s(stamp: Any) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


class AskForHelpNode(Node):
    """Raises help requests on persistently uncertain objects and learns the answers."""

    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        self._params = declare_parameters(self, PARAMETERS)
        self._policy = HelpPolicy(policy_config(self._params))
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._lock = threading.RLock()
        self._images: OrderedDict[tuple[int, int], Image] = OrderedDict()
        self._detections_by_request: dict[str, Any] = {}
        self._unacknowledged: OrderedDict[str, LabelRecord] = OrderedDict()
        self._counters = {'requests': 0, 'no_image': 0, 'labels': 0, 'taught': 0,
                          'teach_refused': 0, 'store_errors': 0, 'malformed': 0,
                          'follow_ups': 0, 'future_stamps': 0, 'invalid_class_names': 0,
                          'oversized_images': 0, 'requests_not_raised': 0,
                          'fleet_labels': 0}
        self._store_problem = ''
        self._signal_problem: str | None = None
        # The store's change feed: the last seq read, and the revision of each label this
        # node has already taken (its own answers and those read before).
        self._feed_seq = 0
        self._known_revisions: dict[str, int] = {}
        self._store = self._open_store()
        self._follow_up = FollowUpTeacher(FollowUpConfig(
            self._params['follow_up_max'], self._params['follow_up_interval_s'],
            self._params['track_timeout_s']))
        self._last_stamp = 0.0

        self._request_pub = self.create_publisher(HelpRequest, 'help_request', HELP_REQUEST_QOS)
        self._diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.create_subscription(Image, 'image', self._on_image, SENSOR_QOS)
        self.create_subscription(DetectionArray, 'detections', self._on_detections,
                                 SENSOR_QOS)
        self.create_subscription(AutonomyState, 'autonomy_state', self._on_autonomy_state,
                                 AUTONOMY_STATE_QOS)
        self.create_service(ProvideLabel, 'provide_label', self._on_provide_label)
        # Its own group, so a slow detector answer never holds up the request path.
        self._teach_group = MutuallyExclusiveCallbackGroup()
        self._teach_client = self.create_client(TeachObject, self._params['teach_service'],
                                                callback_group=self._teach_group)
        self._teach_calls = ResendingCalls(self._teach_client,
                                           self._params['teach_retry_period_s'])
        self.create_timer(self._params['teach_retry_period_s'], self._teach_pending,
                          callback_group=self._teach_group)
        self.create_timer(self._params['fleet_poll_period_s'], self._follow_store,
                          callback_group=self._teach_group)
        self.create_timer(self._params['diagnostics_period_s'], self._publish_diagnostics)
        self._web = self._start_web()
        self.get_logger().info(
            f'asking for help on {self._params["signal"]} as robot '
            f'{self._params["robot_id"]}; label store '
            f'{self._store.location if self._store else "UNAVAILABLE: " + self._store_problem}'
            + (f'; labelling page {self._web.url}' if self._web else ''))

    # --- set-up ------------------------------------------------------------------------
    def _open_store(self) -> LabelStoreBase | None:
        try:
            store = open_label_store(self._params['label_store_url'])
            for record in store.labels():
                if not self._wanted(record):
                    continue
                self._policy.remember(record.request_id, label=record.label,
                                      embedding=record.embedding)
                self._take(record)
            for request in store.pending_requests(robot_id=self._params['robot_id']):
                self._policy.remember(request.request_id, embedding=request.embedding)
            self._feed_seq = store.last_seq()
            return store
        except LabelStoreError as exc:
            # Degraded: requests are still published, answers are refused with the reason.
            self._store_problem = str(exc)
            self.get_logger().error(f'label store unavailable, running degraded: {exc}')
            return None

    def _start_web(self) -> Any:
        if not self._params['web_enabled']:
            return None
        from uq_autonomy.labels.web import LabellingServer, WebConfig

        config = WebConfig(host=self._params['web_host'], port=self._params['web_port'],
                           token=self._params['web_token'] or None)
        server = LabellingServer(self._pending_requests, self.provide_label, config)
        try:
            return server.start()
        except (OSError, RuntimeError, ValueError) as exc:
            self.get_logger().error(f'labelling page not started: {exc}')
            return None

    def _wanted(self, record: LabelRecord) -> bool:
        """Whether this node teaches a stored label: every robot's with
        ``learn_fleet_labels``, else its own robot's (and those without a robot id)."""
        return self._params['learn_fleet_labels'] or record.robot_id in (
            self._params['robot_id'], '')

    def _take(self, record: LabelRecord) -> bool:
        """Queue a stored label for teaching unless this revision was taken already."""
        if self._known_revisions.get(record.request_id) == record.revision:
            return False
        self._known_revisions[record.request_id] = record.revision
        self._unacknowledged[record.request_id] = record
        return True

    def _follow_store(self) -> None:
        """Teach the labels stored since the last look that this node did not store itself:
        answers to other robots' requests (a fleet store), from another labelling page or
        ``uq labels import``."""
        if self._store is None:
            return
        try:
            records = self._store.labels(since_seq=self._feed_seq, limit=500)
        except LabelStoreError as exc:
            self.get_logger().warn(f'cannot read new labels: {exc}', throttle_duration_sec=10.0)
            return
        taken = []
        with self._lock:
            for record in records:
                self._feed_seq = max(self._feed_seq, record.seq)
                if not self._wanted(record) or not self._take(record):
                    continue
                if not self._policy.mark_answered(record.request_id, record.label,
                                                  record.embedding):
                    self._policy.remember(record.request_id, label=record.label,
                                          embedding=record.embedding)
                self._counters['fleet_labels'] += 1
                taken.append(record)
        for record in taken:
            self.get_logger().info(
                f"label '{record.label}' for request {record.request_id} of robot "
                f"{record.robot_id or '(unknown)'} from the store; teaching the detector")
            self._teach(record)

    @property
    def web_url(self) -> str | None:
        """Address of the labelling page, when it is served."""
        return self._web.url if self._web else None

    def _on_set_parameters(self, parameters: list) -> SetParametersResult:
        error = first_invalid(_SPECS, parameters)
        values = dict(self._params)
        values.update({p.name: p.value for p in parameters if p.name in _SPECS})
        if error is None:
            try:
                config = policy_config(values)
            except ValueError as exc:
                error = str(exc)
        if error:
            return SetParametersResult(successful=False, reason=error)
        with self._lock:
            self._params = values
            self._policy.reconfigure(config)
        return SetParametersResult(successful=True)

    # --- inputs ------------------------------------------------------------------------
    def _on_image(self, msg: Image) -> None:
        pixels, size = msg.width * msg.height, len(msg.data)
        if pixels > MAX_IMAGE_PIXELS or size > MAX_IMAGE_BYTES:
            # Never buffered: image_buffer of these would hold gigabytes, and no crop could
            # be cut from one anyway.
            self._counters['oversized_images'] += 1
            self.get_logger().warn(
                f'ignoring an image of {msg.width}x{msg.height} pixels in {size} bytes (at '
                f'most {MAX_IMAGE_PIXELS} pixels and {MAX_IMAGE_BYTES} bytes)',
                throttle_duration_sec=5.0)
            return
        key = (msg.header.stamp.sec, msg.header.stamp.nanosec)
        with self._lock:
            self._images[key] = msg
            self._images.move_to_end(key)
            while len(self._images) > self._params['image_buffer']:
                self._images.popitem(last=False)

    def _on_detections(self, msg: DetectionArray) -> None:
        # A stamp from the future would move the policy's clock ahead: every real frame
        # after it would then look like a jump back in time.
        clock_s = self.get_clock().now().nanoseconds * 1e-9
        problem = future_stamp_problem(_stamp_s(msg.header.stamp), clock_s,
                                       self._params['max_future_stamp_s'])
        if problem:
            self._counters['future_stamps'] += 1
            self.get_logger().warn(f'ignoring an {problem}', throttle_duration_sec=2.0)
            return
        if len(msg.detections) > MAX_DETECTIONS:
            self._counters['malformed'] += 1
            self.get_logger().warn(f'ignoring a DetectionArray of {len(msg.detections)} '
                                   f'detections (at most {MAX_DETECTIONS})',
                                   throttle_duration_sec=2.0)
            return
        self._check_signal(ModelRange(msg.model_id, msg.reference_variance_max,
                                      msg.ood_threshold))
        frame, problems, refused_names = observations(msg)
        if problems:
            self._counters['malformed'] += len(problems)
            self.get_logger().warn(f'ignoring invalid detections: {"; ".join(problems[:3])}',
                                   throttle_duration_sec=2.0)
        if refused_names:
            self._counters['invalid_class_names'] += len(refused_names)
            self.get_logger().warn('leaving out class names the label store refuses (their '
                                   f'detections are kept): {"; ".join(refused_names[:3])}',
                                   throttle_duration_sec=2.0)
        with self._lock:
            try:
                decisions = self._policy.observe(_stamp_s(msg.header.stamp), frame)
            except ValueError as exc:
                self._counters['malformed'] += 1
                self.get_logger().warn(f'ignoring a DetectionArray: {exc}',
                                       throttle_duration_sec=2.0)
                return
            for decision in decisions:
                try:
                    self._raise(decision, msg)
                except (ValueError, IndexError) as exc:
                    self._policy.cancel(decision.request_id)
                    self._counters['requests_not_raised'] += 1
                    self.get_logger().error(f'help request {decision.request_id} not raised: '
                                            f'{exc}', throttle_duration_sec=2.0)
            self._last_stamp = _stamp_s(msg.header.stamp)
            config = self._policy.config
            for obs in frame:  # the valid detections only
                update_id = self._follow_up.observe(
                    self._last_stamp, obs.track_id, obs.class_name, obs.signal(config.signal),
                    config.threshold)
                if update_id is not None and obs.embedding is not None:
                    self._teach_follow_up(update_id, self._follow_up.label_of(obs.track_id),
                                          obs.embedding, msg.model_id)

    def _on_autonomy_state(self, msg: AutonomyState) -> None:
        if not (msg.suspect_hold and msg.suspect_track_id >= 0):
            return
        with self._lock:
            if self._params['ask_before_hand_over']:
                self._policy.ask_before_hand_over(msg.suspect_track_id)

    def _check_signal(self, model: ModelRange) -> None:
        """Report, once when it appears or changes, a signal the frame's model cannot give."""
        with self._lock:
            config = self._policy.config
        problem = signal_problem(config.signal, f'{config.signal.value}_threshold',
                                 (config.threshold,), model)
        if problem == self._signal_problem:
            return
        self._signal_problem = problem
        if problem is not None:
            self.get_logger().error(f'{problem}; only the out-of-distribution flag '
                                    f'(ood_mode {config.ood_mode.value}) raises requests')
        else:
            self.get_logger().info(f'the uncertainty signal now suits the model '
                                   f'({config.signal.value})')

    def _raise(self, decision: HelpDecision, msg: DetectionArray) -> None:
        key = (msg.header.stamp.sec, msg.header.stamp.nanosec)
        image = self._images.get(key)
        if image is None:
            # Without the frame there is no crop to show: not asked now, budget refunded;
            # the track stays askable and is asked about on a later frame.
            self._policy.cancel(decision.request_id)
            self._counters['no_image'] += 1
            self.get_logger().warn('no image for the stamp of a help request yet; asking '
                                   'later', throttle_duration_sec=5.0)
            return
        try:
            rgb = image_to_rgb(image.height, image.width, image.encoding, image.step,
                               image.data, bool(image.is_bigendian), MAX_IMAGE_PIXELS)
        except (ImageFormatError, ValueError) as exc:
            self._policy.cancel(decision.request_id)
            self.get_logger().warn(f'cannot crop from the image: {exc}',
                                   throttle_duration_sec=5.0)
            return
        height, width = rgb.shape[:2]
        box = decision.observation.box
        region = crop_region(box, width, height, margin=self._params['crop_margin'])
        crop = np.ascontiguousarray(cut(rgb, region))
        detection = next((d for d in msg.detections
                          if d.track_id == decision.track_id), msg.detections[0])
        # The detector learns from this vector, so it must be the detector's own feature of
        # the object (the detection's raw embedding), not the policy's unit-normalised
        # track mean, which lies elsewhere in the GP's feature space.
        raw = decision.observation.embedding
        embedding = raw if raw is not None else decision.embedding
        pending = PendingRequest(
            decision.request_id, created=time.time(), reason=decision.reason,
            candidates=tuple((c.label, c.probability) for c in decision.candidates),
            crop_png=encode_png(crop),
            embedding=None if embedding is None else np.asarray(embedding, np.float32),
            box=box_in_region(box, region), crop_origin=(float(region[0]), float(region[1])),
            image_size=(width, height), stamp=_stamp_s(msg.header.stamp),
            track_id=decision.track_id, class_name=decision.observation.class_name,
            model_id=msg.model_id, robot_id=self._params['robot_id'])
        if self._store is not None:
            try:
                self._store.add_request(pending)
            except LabelStoreError as exc:
                self._counters['store_errors'] += 1
                self.get_logger().error(f'cannot store help request: {exc}',
                                        throttle_duration_sec=5.0)
        request = HelpRequest()
        request.header = msg.header
        request.request_id = decision.request_id
        fields = rgb_to_image_fields(crop)
        request.crop.header = msg.header
        request.crop.height, request.crop.width = fields['height'], fields['width']
        request.crop.encoding, request.crop.step = fields['encoding'], fields['step']
        request.crop.is_bigendian, request.crop.data = fields['is_bigendian'], fields['data']
        request.detection = detection
        request.candidate_labels = [c.label for c in decision.candidates]
        request.candidate_probabilities = [float(c.probability) for c in decision.candidates]
        request.reason = decision.reason
        self._detections_by_request[decision.request_id] = detection
        self._request_pub.publish(request)
        self._counters['requests'] += 1
        self.get_logger().info(f'help request {decision.request_id}: {decision.reason}')

    # --- answers -----------------------------------------------------------------------
    def _pending_requests(self) -> list[PendingRequest]:
        if self._store is None:
            return []
        try:
            return list(self._store.pending_requests())
        except LabelStoreError as exc:
            self.get_logger().error(f'cannot read pending requests: {exc}',
                                    throttle_duration_sec=5.0)
            return []

    def provide_label(self, request_id: str, label: str, labeler: str) -> tuple[bool, str]:
        """Store an answer and teach it (the service, the web page and tests call this)."""
        if self._store is None:
            return False, f'label store unavailable: {self._store_problem}'
        try:
            result = self._store.answer(request_id, label, labeler or self._params['labeler'],
                                        source=NODE_NAME)
        except LabelValidationError as exc:
            return False, str(exc)
        except LabelStoreError as exc:
            self._counters['store_errors'] += 1
            return False, f'label not stored: {exc}'
        if not result.accepted:
            return False, result.message
        record = result.record
        if result.changed and record is not None:
            with self._lock:
                self._policy.mark_answered(request_id, record.label, record.embedding)
                asked = self._detections_by_request.get(request_id)
                if asked is not None:
                    self._follow_up.bind(asked.track_id, request_id, record.label,
                                         self._last_stamp)
                self._take(record)
                self._counters['labels'] += 1
            self._teach(record)
            return True, f'{result.message}; teaching the detector'
        return True, result.message

    def _on_provide_label(self, request: ProvideLabel.Request,
                          response: ProvideLabel.Response) -> ProvideLabel.Response:
        accepted, message = self.provide_label(request.request_id, request.label,
                                               request.labeler)
        if accepted:
            self.get_logger().info(f'label for {request.request_id!r:.80}: {message}')
        else:
            self.get_logger().warn(f'label for {request.request_id!r:.80} refused: {message}')
        response.accepted, response.message = accepted, message
        return response

    # --- teaching ----------------------------------------------------------------------
    def _teach(self, record: LabelRecord) -> None:
        if record.embedding is None:
            self.get_logger().warn(f'label {record.request_id}: no embedding stored; the '
                                   'detector cannot learn it (kept in the store)')
            with self._lock:
                self._unacknowledged.pop(record.request_id, None)
            return
        if not self._teach_client.service_is_ready():
            return  # retried by _teach_pending
        request = TeachObject.Request(request_id=record.request_id, label=record.label,
                                      embedding=np.asarray(record.embedding, np.float32)
                                      .tolist(), model_id=record.model_id)
        self._teach_calls.send(record.request_id, request,
                               lambda f, r=record: self._on_taught(r, f))

    def _on_taught(self, record: LabelRecord, future: Any) -> None:
        try:
            response = future.result()
        except Exception as exc:  # the call failed on the transport; retried later
            self.get_logger().warn(f'teaching {record.request_id} failed: {exc}')
            return
        with self._lock:
            self._unacknowledged.pop(record.request_id, None)
            if response.accepted:
                self._counters['taught'] += 1
            else:
                self._counters['teach_refused'] += 1
        if response.accepted:
            self.get_logger().info(f'detector: {response.message}')
        else:
            self.get_logger().error(f'detector refused label {record.request_id}: '
                                    f'{response.message}')

    def _teach_follow_up(self, update_id: str, label: str | None, embedding: Any,
                         model_id: str) -> None:
        # Not stored: the person's answer is in the store; these follow it (module
        # uq_autonomy.help.follow_up). A follow-up the detector misses is not retried.
        if label is None or not self._teach_client.service_is_ready():
            return
        request = TeachObject.Request(request_id=update_id, label=label,
                                      embedding=np.asarray(embedding, np.float32).tolist(),
                                      model_id=model_id)
        future = self._teach_client.call_async(request)

        def done(f: Any) -> None:
            try:
                response = f.result()
            except Exception as exc:  # transport failure: dropped, see above
                self.get_logger().warn(f'follow-up teaching {update_id} failed: {exc}')
                return
            self._counters['follow_ups'] += 1
            self.get_logger().info(f'follow-up {update_id} ({label!r}): {response.message}')
        future.add_done_callback(done)

    def _teach_pending(self) -> None:
        for request_id, attempt in self._teach_calls.resend_overdue():
            self.get_logger().warn(f'no answer from the detector to label {request_id}; '
                                   f'sent again (attempt {attempt})')
        with self._lock:
            records = list(self._unacknowledged.values())
        for record in records:
            self._teach(record)

    # --- diagnostics -------------------------------------------------------------------
    def _publish_diagnostics(self) -> None:
        with self._lock:
            counters = dict(self._counters)
            unacknowledged = len(self._unacknowledged)
            pending = len(self._policy.pending())
        level = DiagnosticStatus.OK
        message = f'{pending} requests open, {unacknowledged} labels not yet taught'
        if self._signal_problem is not None:
            level, message = DiagnosticStatus.ERROR, self._signal_problem
        if self._store is None:
            level, message = DiagnosticStatus.ERROR, f'label store unavailable: ' \
                                                     f'{self._store_problem}'
        status = DiagnosticStatus(level=level, name=f'{self.get_name()}: ask for help',
                                  hardware_id=self.get_fully_qualified_name(),
                                  message=message)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in (
            *counters.items(), ('open_requests', pending),
            ('labels_not_yet_taught', unacknowledged),
            ('signal_problem', self._signal_problem or ''),
            ('web_url', self.web_url or ''))]
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(array)

    def destroy_node(self) -> None:
        if self._web is not None:
            self._web.stop()
            self._web = None
        if self._store is not None:
            self._store.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the node until shut down; returns the exit code (1 for an invalid configuration)."""
    parser = node_argument_parser(
        NODE_NAME, __doc__.split('\n\n')[0], PARAMETERS, 'config/ask_for_help.yaml',
        'topics: sub detections, image; pub help_request, /diagnostics; service '
        'provide_label; client teach_object. Remap with --ros-args -r from:=to.')
    return run_node(AskForHelpNode, parser, args)


if __name__ == '__main__':
    import sys

    sys.exit(main())
