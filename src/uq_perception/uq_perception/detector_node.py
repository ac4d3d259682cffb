"""Detector node: camera images in, detections with NTK-GP uncertainty out.

A managed (lifecycle) node, as in ros2/demos ``lifecycle_py``: the model, the GP and the
backend are loaded in ``on_configure`` and freed in ``on_cleanup``; the image
subscription and the diagnostics timer exist only while active, and every publisher is a
lifecycle publisher, so nothing is published while inactive. The node only adapts ROS to
:class:`uq_perception.perception.UncertaintyPerception`.

The detector is any detector of the contract (docs/detector_contract.md), opened by
:mod:`uq_perception.runtime.loading`: the shipped model on one of its backends
(``onnxruntime`` by default, ``pytorch-cpu`` when its ONNX export cannot run), or an ONNX
file (``model_format:=onnx``) read by the ONNX adapter with the ``onnx_*`` settings.

Topics (relative names, remap as usual):

- ``image`` (sensor_msgs/Image, in): best-effort, depth 1, so a slow frame makes the
  next ones be dropped instead of queued stale; reliable publishers match too.
- ``camera_info`` (sensor_msgs/CameraInfo, in, optional): size consistency check. An
  image whose size differs from the latest camera_info's ``width`` x ``height`` (both
  non-zero) is still processed (the detector resizes every frame), but it is counted
  (``camera_info_mismatches``) and makes the diagnostics WARN: the intrinsics then do not
  describe the image, and whatever projects detections with them is off.
- ``detections`` (uq_msgs/DetectionArray, out): stamped with the image's stamp.
- ``detections_2d`` (vision_msgs/Detection2DArray, out): the same detections, in the same
  order and with the same header, as the ecosystem's standard 2D detections (class
  probabilities, box covariance, track id, calibrated score, track score and OOD flag by the
  convention of docs/detector_contract.md); built only while someone subscribes. Where
  vision_msgs is not installed, or with ``publish_vision_msgs: false``, it does not exist
  and the node says so in one line at start.
- ``overlay`` (sensor_msgs/Image, out): boxes coloured by uncertainty (only rendered
  while someone subscribes).
- ``markers`` (visualization_msgs/MarkerArray, out).
- ``/diagnostics`` (diagnostic_msgs/DiagnosticArray, out) at ``diagnostics_period``:
  input rate; over the last 300 frames the latency p50/p99 (DDS reception stamp to
  DetectionArray published), its parts before the callback (DDS transport, dispatch),
  the backend call's p50 (``forward_p50_ms``) and each frame's latency less its backend
  call (``overhead_p50_ms``, ``overhead_p99_ms``: what the node adds to the network);
  the p50 and p99 of each stage of :data:`FRAME_STAGES` (``stage_<name>_p50_ms``); frames
  processed, dropped and rejected, inference errors, backend, device, model id,
  the learnt state: where labels are saved (``learnt_state``), where the GP running came
  from at configure (``learnt_state_source``: the learnt state file and its number of
  labels, or the shipped GP) and the labels applied (``labels_learnt``); the calibrated
  score's reference (``score_reference``: split, objects, largest variance). A learnt state
  that could not be used (moved aside, ``uq_perception/teaching.py``) keeps the level at
  WARN until the next configure.

Each detection carries its track's evidence (``Uncertainty.track_score``, ``track_views``,
``track_labelled``): its calibrated score pooled over the object's views by
:class:`uq_perception.track_evidence.TrackEvidence`, on the images' stamps, with the
``track_*`` parameters. A label taught through ``teach_object`` restarts the evidence of the
track whose embedding is closest to the labelled one.

Labels taught through ``teach_object`` persist by default: the GP state is saved after
every label to ``learned_gp_path``, by default ``$ROS_HOME/uq/learned/<model id>.npz``
(``~/.ros`` when ``ROS_HOME`` is unset), and loaded from there at configure, so a restarted
detector knows what it was taught. ``persist_learnt_state: false`` keeps labels in memory
only (evaluations that must start from the shipped GP every run).

Threads: the image subscription lives on a private input node,
``<name>_image_input`` in the same namespace (:class:`ImageInputThread`), served by a
dedicated thread that waits on that subscription alone, then converts, infers and
publishes. The detector's executor thread therefore stays free for parameters, lifecycle
services and diagnostics whatever inference costs (docs/design.md, conventions); a frame
that arrives while one is being processed waits in the depth-1 DDS queue, where a newer one
replaces it (counted as dropped from the publisher's sequence numbers). docs/performance.md
gives the reasons for this choice over
rclpy's executors.
"""

from __future__ import annotations

import gc
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    QoSProfile,
    ReliabilityPolicy,
    qos_profile_sensor_data,
)
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from uq_common.image_codec import (
    MAX_IMAGE_PIXELS,
    ImageFields,
    ImageFormatError,
    image_to_rgb,
    parse_image_cdr,
    rgb_to_image_fields,
)
from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import ParameterSpec, declare_parameters, first_invalid
from uq_common.rolling_stats import RollingStats
from uq_msgs.msg import DetectionArray
from uq_msgs.srv import TeachObject
from uq_perception.detectors.model_files import default_detector_path, default_gp_path
from uq_perception.duplicate_suppression import DuplicateSuppression
from uq_perception.messages import (
    VISION_MSGS_MISSING,
    Detection2DArray,
    Detection2DArrayBuilder,
    DetectionArrayBuilder,
    marker_array_message,
)
from uq_perception.runtime.backend_choice import DEFAULT_CPU_BACKEND, BackendKind, Precision
from uq_perception.runtime.loading import (
    ModelFormat,
    adapter_config_from_parameters,
    runtime_from_parameters,
)
from uq_perception.runtime.onnx_adapter import (
    BoxFormat,
    ChannelOrder,
    HeadLayout,
    NmsMode,
    ResizeMode,
    ScoreActivation,
)
from uq_perception.runtime.onnx_runtime import MAX_THREADS, ExecutionProvider
from uq_perception.track_evidence import TrackEvidenceConfig

NODE_NAME = 'detector_node'
#: The stages of a frame, timed in the node, in order (diagnostics ``stage_<name>_p50_ms`` and
#: ``_p99_ms``): DDS from the publisher's source stamp to this node taking the image;
#: taking and converting it to RGB; resizing and normalising it; the network (and its
#: decode); the GP's summaries and box deviations; duplicate suppression, tracking and the
#: tracks' evidence; building the DetectionArray; publishing it.
FRAME_STAGES = ('transport', 'receive_convert', 'resize_normalise', 'forward', 'gp',
                'duplicates_tracking', 'message', 'publish')
_INPUT_SIZE_RULE = 'onnx_input_width and onnx_input_height: both 0 or both set'
_CUDA_RULE = 'true or fp16 only with backend pytorch-cuda'


PARAMETERS = [
    ParameterSpec('model_format', ModelFormat.TORCH.value,
                  'What model_path holds: torch (a uq_perception detector, the shipped '
                  'CenterNet) or onnx (any ONNX detector with a linear class head, read by '
                  'the ONNX adapter with the onnx_* settings; docs/detector_contract.md).',
                  choices=[f.value for f in ModelFormat], read_only=True),
    ParameterSpec('model_path', str(default_detector_path()),
                  'Detector file (of model_format); default: the shipped model '
                  '(share/uq_perception/models, or $UQ_MODEL_DIR).', read_only=True),
    ParameterSpec('gp_path', str(default_gp_path()),
                  'NTK-GP artefact fitted for this detector (its model id must match).',
                  read_only=True),
    ParameterSpec('backend', DEFAULT_CPU_BACKEND.value,
                  'Inference backend. onnxruntime runs an ONNX export of a torch model '
                  '(built on first start, cached under onnx_cache_dir, checked against '
                  'torch; pytorch-cpu with a warning when it cannot) and every ONNX model.',
                  choices=[k.value for k in BackendKind], read_only=True),
    ParameterSpec('engine_path', '',
                  'TensorRT engine built by `uq build-engine` (backend tensorrt only).',
                  read_only=True),
    ParameterSpec('cuda_graph', False,
                  'Backend pytorch-cuda: capture the network and the GP variance of every '
                  'candidate in one CUDA graph per frame size and replay it per frame (eager, '
                  'with a warning, where capture fails).', read_only=True,
                  constraints=_CUDA_RULE),
    ParameterSpec('precision', Precision.FP32.value,
                  'Backend pytorch-cuda: precision of the network, fp32 or fp16 (as the '
                  'TensorRT engine: float16 weights and input, the GP variance in float32).',
                  choices=[v.value for v in Precision], read_only=True, constraints=_CUDA_RULE),
    ParameterSpec('gpu_preprocess', False,
                  'Backend pytorch-cuda: upload the raw uint8 frame and resize and normalise '
                  'it on the GPU (false: resized on the host, as on the CPU).', read_only=True,
                  constraints=_CUDA_RULE),
    ParameterSpec('warmup_frames', 3,
                  'Blank frames run through every backend but pytorch-cpu on configure, so '
                  'the first camera frames do not pay for lazy initialisation (0: none).',
                  min_value=0, max_value=100, read_only=True),
    ParameterSpec('torch_threads', 1,
                  'CPU threads of the PyTorch backends. One is the robust choice on a '
                  'shared CPU: spinning OpenMP threads stall when other processes (the '
                  'rest of the robot stack) want the cores.',
                  min_value=1, max_value=64, read_only=True),
    ParameterSpec('onnx_provider', ExecutionProvider.CPU.value,
                  'ONNX Runtime execution provider of the onnxruntime backend (cuda and '
                  'tensorrt need onnxruntime-gpu).',
                  choices=[p.value for p in ExecutionProvider], read_only=True),
    ParameterSpec('onnx_threads', 1,
                  'Intra-op CPU threads of ONNX Runtime (one: as torch_threads).',
                  min_value=1, max_value=MAX_THREADS, read_only=True),
    ParameterSpec('onnx_cache_dir', '',
                  'Where the ONNX export of a torch model is cached; empty: $UQ_CACHE_DIR, '
                  'else $ROS_HOME/uq_perception, else ~/.ros/uq_perception.', read_only=True),
    ParameterSpec('onnx_layout', HeadLayout.AUTO.value,
                  'Output layout of an ONNX model: yolo ((1, 4 + C, N) from per-scale 1x1 '
                  'class convolutions), detr (per-query boxes and logits from a final linear '
                  'layer), or auto.', choices=[v.value for v in HeadLayout], read_only=True),
    ParameterSpec('onnx_class_nodes', '',
                  'Comma-separated names of the class-logit node(s) of an ONNX model, in '
                  'anchor order; empty: found automatically.', read_only=True),
    ParameterSpec('onnx_input_width', 0,
                  'Network input width of an ONNX model with a dynamic input (0: its own).',
                  min_value=0, max_value=8192, read_only=True, constraints=_INPUT_SIZE_RULE),
    ParameterSpec('onnx_input_height', 0,
                  'Network input height of an ONNX model with a dynamic input (0: its own).',
                  min_value=0, max_value=8192, read_only=True, constraints=_INPUT_SIZE_RULE),
    ParameterSpec('onnx_resize', ResizeMode.AUTO.value,
                  'How a frame becomes the ONNX model\'s input: letterbox (aspect kept, '
                  'padded), stretch, or auto (stretch when the model\'s metadata names '
                  'RT-DETR, else letterbox).', choices=[v.value for v in ResizeMode],
                  read_only=True),
    ParameterSpec('onnx_pad_value', 114, 'Grey level of the letterbox padding.',
                  min_value=0, max_value=255, read_only=True),
    ParameterSpec('onnx_channel_order', ChannelOrder.RGB.value,
                  'Channel order the ONNX model expects.',
                  choices=[v.value for v in ChannelOrder], read_only=True),
    ParameterSpec('onnx_mean', [0.0, 0.0, 0.0],
                  'Per-channel mean subtracted from the [0, 1] input (model channel order).',
                  min_value=-10.0, max_value=10.0, read_only=True,
                  constraints='3 values'),
    ParameterSpec('onnx_std', [1.0, 1.0, 1.0],
                  'Per-channel standard deviation dividing the input after the mean.',
                  min_value=1e-6, max_value=10.0, read_only=True,
                  constraints='3 values'),
    ParameterSpec('onnx_box_format', BoxFormat.AUTO.value,
                  'Box coordinates of the ONNX model (auto: cxcywh pixels for yolo, '
                  'cxcywh-normalized for detr).',
                  choices=[v.value for v in BoxFormat], read_only=True),
    ParameterSpec('onnx_score_activation', ScoreActivation.AUTO.value,
                  'Logits to class probabilities (auto: the activation found in the graph, '
                  'else sigmoid).', choices=[v.value for v in ScoreActivation], read_only=True),
    ParameterSpec('onnx_nms', NmsMode.AUTO.value,
                  'Non-maximum suppression of the ONNX model\'s boxes (auto: class for yolo, '
                  'none for detr).', choices=[v.value for v in NmsMode], read_only=True),
    ParameterSpec('onnx_nms_iou', 0.7, 'IoU above which the weaker box is suppressed.',
                  min_value=0.01, max_value=1.0, read_only=True),
    ParameterSpec('onnx_max_candidates', 300, 'Most candidates entering suppression.',
                  min_value=1, max_value=100_000, read_only=True),
    ParameterSpec('onnx_class_names', '',
                  'Comma-separated class names of an ONNX model; empty: its names metadata, '
                  'else class_0 ...', read_only=True),
    ParameterSpec('score_threshold', 0.3, 'Minimum objectness of a published detection.',
                  min_value=0.0, max_value=1.0),
    ParameterSpec('max_detections', 20, 'Maximum detections per image.',
                  min_value=1, max_value=100),
    ParameterSpec('tracking_iou', 0.3, 'Minimum IoU to continue an object track.',
                  min_value=0.01, max_value=1.0),
    ParameterSpec('track_view_change', 0.1,
                  'A frame is a new view of its track (counted in Uncertainty.track_score) '
                  'when its box moved by this share of the last counted view\'s diagonal, or '
                  'its area changed by this much in log ratio (uq_perception/track_evidence.py); '
                  '0: every frame is a view (a fixed camera).',
                  min_value=0.0, max_value=10.0),
    ParameterSpec('track_max_views', 64,
                  'Most recent views of a track whose calibrated scores track_score averages.',
                  min_value=1, max_value=10_000),
    ParameterSpec('track_memory_s', 3.0,
                  'Seconds (of image stamps) a lost track\'s evidence is kept for a new track '
                  'of the same object to take over.', min_value=0.0, max_value=600.0),
    ParameterSpec('track_reform_iou', 0.3,
                  'Minimum IoU of a new track\'s first box with a lost track\'s last box to '
                  'take over its evidence.', min_value=0.01, max_value=1.0),
    ParameterSpec('track_reform_cosine', 0.8,
                  'Minimum cosine similarity of their embeddings to take over the evidence; '
                  'also what a label taught through teach_object needs to restart a track\'s.',
                  min_value=0.01, max_value=1.0),
    ParameterSpec('suppress_duplicates', True,
                  'Drop duplicate boxes of one object, across classes '
                  '(uq_perception/duplicate_suppression.py): a weaker box overlapping a '
                  'stronger one by duplicate_iou, or lying duplicate_containment inside it '
                  'with at most duplicate_score_ratio of its score.'),
    ParameterSpec('duplicate_iou', 0.7,
                  'IoU with a stronger box at or above which a box is a duplicate.',
                  min_value=0.01, max_value=1.0),
    ParameterSpec('duplicate_containment', 0.7,
                  'Share of a box inside a stronger box at or above which it may be a part '
                  'of the same object.', min_value=0.01, max_value=1.0),
    ParameterSpec('duplicate_score_ratio', 0.6,
                  'A box inside a stronger one is a part of it when its score is at most '
                  'this fraction of the stronger score (0: never).',
                  min_value=0.0, max_value=0.99),
    ParameterSpec('max_image_pixels', MAX_IMAGE_PIXELS,
                  'Frames with more pixels are rejected before decoding.',
                  min_value=1, max_value=100_000_000),
    ParameterSpec('diagnostics_period', 1.0, 'Seconds between diagnostics messages.',
                  min_value=0.05, max_value=1.0, read_only=True),
    ParameterSpec('stale_input_timeout', 2.0,
                  'Seconds without images after which diagnostics report a stale input.',
                  min_value=0.1, max_value=60.0),
    ParameterSpec('autostart', False,
                  'Configure and activate at start-up (instead of waiting for a '
                  'lifecycle manager).', read_only=True),
    ParameterSpec('publish_embeddings', True,
                  'Publish each detection\'s feature vector (Detection.embedding), which the '
                  'ask-for-help node needs to teach labels and to recognise objects again.'),
    ParameterSpec('publish_vision_msgs', True,
                  'Also publish detections_2d (vision_msgs/Detection2DArray, '
                  'docs/detector_contract.md) where vision_msgs is installed; false: only '
                  'detections.', read_only=True),
    ParameterSpec('label_trust', 0.99,
                  'Share of the posterior at a labelled object\'s feature that one person\'s '
                  'label decides (0: a label counts as one training point; '
                  'uq_perception/teaching.py).', min_value=0.0, max_value=0.999),
    ParameterSpec('learned_gp_path', '',
                  'File where the GP state learnt from labels (teach_object) is saved after '
                  'every label and loaded at configure when it belongs to the same model; '
                  'empty: $ROS_HOME/uq/learned/<model id>.npz (~/.ros when ROS_HOME is '
                  'unset).', read_only=True),
    ParameterSpec('persist_learnt_state', True,
                  'Keep the learnt GP state in learned_gp_path across restarts; false: '
                  'labels are kept in memory only and lost when the node stops.',
                  read_only=True),
]
_SPECS = {spec.name: spec for spec in PARAMETERS}
_IMAGE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                        reliability=ReliabilityPolicy.BEST_EFFORT,
                        durability=DurabilityPolicy.VOLATILE)


def image_fields(serialized: bytes) -> ImageFields:
    """The fields of a serialised ``sensor_msgs/Image``, its pixels a view of ``serialized``;
    read by :func:`parse_image_cdr`, or by rclpy where the middleware used another
    encapsulation than plain CDR.

    Raises
    ------
    ImageFormatError
        If the plain CDR is malformed.
    """
    fields = parse_image_cdr(serialized)
    if fields is not None:
        return fields
    msg = deserialize_message(serialized, Image)
    return ImageFields(msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id,
                       msg.height, msg.width, msg.encoding, bool(msg.is_bigendian), msg.step,
                       memoryview(msg.data))


def _duplicates(params: dict[str, Any]) -> DuplicateSuppression | None:
    """The duplicate suppression the parameters ask for (``None``: off)."""
    if not params['suppress_duplicates']:
        return None
    return DuplicateSuppression(params['duplicate_iou'], params['duplicate_containment'],
                                params['duplicate_score_ratio'])


def _evidence_config(params: dict[str, Any]) -> TrackEvidenceConfig:
    """The track evidence settings the parameters ask for."""
    return TrackEvidenceConfig(
        view_change=params['track_view_change'], max_views=params['track_max_views'],
        memory_s=params['track_memory_s'], reform_iou=params['track_reform_iou'],
        reform_cosine=params['track_reform_cosine'])


class ImageInputThread:
    """An image subscription served by a thread of its own, without an executor.

    The subscription belongs to a private node, ``<owner>_image_input`` in the owner's
    namespace, created without the global ROS arguments (a ``__node:=`` remapping would
    otherwise give it the owner's name); it subscribes to the topic the owner resolves
    ``topic`` to, so the owner's remappings apply. The private node is in no executor:
    the thread waits on the subscription alone and takes each message itself, with
    rclpy's wait-set primitive (the one ``rclpy.wait_for_message`` is built on): an
    executor rebuilds and scans its whole wait set in Python for every message, which
    costs more than the message itself (docs/performance.md). Each image is taken
    serialised, as DDS delivered it: :func:`image_fields` reads it without rclpy's copy of
    the pixels into a Python array.

    Parameters
    ----------
    owner
        The node the images are for.
    topic
        Image topic name, relative to the owner.
    callback
        Called on this object's thread with each serialised ``Image``, its message info and
        the system time (ns) just before it was taken.
    """

    def __init__(self, owner: Node, topic: str,
                 callback: Callable[[bytes, dict, int], None]) -> None:
        self._context = owner.context
        self._callback = callback
        self._node = rclpy.create_node(
            f'{owner.get_name()}_image_input', namespace=owner.get_namespace(),
            context=owner.context, use_global_arguments=False, enable_rosout=False,
            start_parameter_services=False,
            parameter_overrides=[Parameter('start_type_description_service', value=False)])
        # The callback here is never called by rclpy (no executor): the thread takes and
        # hands on each message itself.
        self._subscription = self._node.create_subscription(
            Image, owner.resolve_topic_name(topic), lambda _: None, _IMAGE_QOS)
        self._stopping = False
        # Triggered by stop() and by the context's shutdown, to end the wait.
        self._wake = self._node.create_guard_condition(lambda: None)
        self._context.on_shutdown(self._on_context_shutdown)
        self._thread = threading.Thread(target=self._serve, name=f'{owner.get_name()}_images',
                                        daemon=True)
        self._thread.start()

    def _on_context_shutdown(self) -> None:
        if not self._stopping:
            self._wake.trigger()

    def _serve(self) -> None:
        subscription, wake = self._subscription.handle, self._wake.handle
        try:
            wait_set = _rclpy.WaitSet(1, 1, 0, 0, 0, 0, self._context.handle)
            while not self._stopping and self._context.ok():
                wait_set.clear_entities()
                wait_set.add_subscription(subscription)
                wait_set.add_guard_condition(wake)
                wait_set.wait(-1)
                if subscription.pointer not in wait_set.get_ready_entities('subscription'):
                    continue
                taken_ns = time.time_ns()
                taken = subscription.take_message(Image, True)
                if taken is not None:
                    self._callback(*taken, taken_ns)
        except Exception:
            if self._context.ok():
                raise
            # The process is shutting down (Ctrl-C); stop() still releases the node.

    def stop(self) -> None:
        """Let the callback in progress finish, then stop the thread and free the node."""
        self._stopping = True
        self._wake.trigger()
        self._thread.join()
        self._node.destroy_node()


class DetectorNode(LifecycleNode):
    """Lifecycle node publishing ``uq_msgs/DetectionArray`` with NTK-GP uncertainty."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._params = declare_parameters(self, PARAMETERS)
        # Rules across parameters, checked at start-up like each value's own (ValueError).
        self._runtime = runtime_from_parameters(self._params)
        self._adapter = adapter_config_from_parameters(self._params)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._backend_name = ''
        self._perception: Any = None
        self._model_id = ''
        self._device = ''
        self._outputs: dict[str, Any] = {}
        self._detection_builder = DetectionArrayBuilder()
        # The outputs' header, set from each image's before its messages are built.
        self._header = Header()
        self._vision_msgs = self._params['publish_vision_msgs'] and not VISION_MSGS_MISSING
        self._detection_2d_builder = Detection2DArrayBuilder() if self._vision_msgs else None
        if not self._params['publish_vision_msgs']:
            self.get_logger().info('detections_2d (vision_msgs) not published: '
                                   'publish_vision_msgs is false')
        elif VISION_MSGS_MISSING:
            self.get_logger().info(f'detections_2d (vision_msgs/Detection2DArray) not '
                                   f'published: {VISION_MSGS_MISSING}')
        self._image_input: ImageInputThread | None = None
        self._info_sub: Any = None
        self._diagnostics_timer: Any = None
        self._teach_service: Any = None
        # Where teach_object saves labels, and why the learnt state at learned_gp_path could
        # not be used (set at configure; reported by diagnostics until the next configure).
        self._learnt_save_path: Path | None = None
        self._learnt_state_problem = ''
        self._learnt_state_source = ''
        # Why the GP artefact's calibrated-score reference cannot rank detections (set at
        # configure, reported by diagnostics).
        self._reference_problem: str | None = None
        self._reset_stats()
        if self._params['autostart']:
            self._autostart_timer = self.create_timer(0.0, self._autostart)

    # --- lifecycle -------------------------------------------------------------------
    def _autostart(self) -> None:
        self.destroy_timer(self._autostart_timer)
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self._perception = self._load_perception()
        except Exception as exc:
            # rclpy turns an exception escaping this callback into ERROR without a log line;
            # whatever the cause (a malformed file may raise anything), say it and stay
            # unconfigured.
            self.get_logger().error(f'configure failed, staying unconfigured: '
                                    f'{type(exc).__name__}: {exc}')
            return TransitionCallbackReturn.FAILURE
        reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self._outputs = {
            'detections': self.create_lifecycle_publisher(DetectionArray, 'detections',
                                                          reliable),
            'overlay': self.create_lifecycle_publisher(Image, 'overlay',
                                                       qos_profile_sensor_data),
            'markers': self.create_lifecycle_publisher(MarkerArray, 'markers', reliable),
            'diagnostics': self.create_lifecycle_publisher(DiagnosticArray, '/diagnostics',
                                                           reliable),
        }
        if self._vision_msgs:
            try:
                self._outputs['detections_2d'] = self.create_lifecycle_publisher(
                    Detection2DArray, 'detections_2d', reliable)
            except Exception as exc:
                # The Python module imports but its type support cannot load (a partial
                # install): the other outputs go on.
                self._vision_msgs = False
                self.get_logger().warning(f'detections_2d (vision_msgs) not published: '
                                          f'{type(exc).__name__}: {exc}')
        # Labels are learnt while configured, active or not: a person may answer while the
        # camera is paused.
        self._teach_service = self.create_service(TeachObject, 'teach_object', self._on_teach)
        reference = self._perception.gp.score_reference
        self._reference_problem = reference.spread_problem() if reference is not None else None
        if self._reference_problem:
            self.get_logger().warning(f'{self._params["gp_path"]}: {self._reference_problem}')
        # The objects of the start (modules, the model, the GP, rclpy's) live as long as the
        # node: kept out of the cyclic collector's full passes, which otherwise walk all of
        # them every few hundred frames and hold every thread for tens of ms (a lost frame
        # at 60 Hz). Unfrozen at cleanup, when the model is let go.
        gc.collect()
        gc.freeze()
        self.get_logger().info(
            f'configured: model {self._model_id} from {self._params["model_path"]} on '
            f'{self._backend_name} '
            f'({self._device}), classes {self._perception.gp.class_names}')
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._reset_stats()
        self._image_input = ImageInputThread(self, 'image', self._on_image)
        self._info_sub = self.create_subscription(
            CameraInfo, 'camera_info', self._on_camera_info, qos_profile_sensor_data)
        self._diagnostics_timer = self.create_timer(
            self._params['diagnostics_period'], self._publish_diagnostics)
        self.get_logger().info('active: processing images')
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_io()
        self.get_logger().info('inactive: not processing images')
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_io()
        if self._teach_service is not None:
            self.destroy_service(self._teach_service)
            self._teach_service = None
        for publisher in self._outputs.values():
            self.destroy_lifecycle_publisher(publisher)
        self._outputs = {}
        self._perception = None
        gc.unfreeze()
        self._learnt_save_path, self._learnt_state_problem = None, ''
        self._learnt_state_source = ''
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self.on_cleanup(state)

    def destroy_node(self) -> None:
        # Destroyed while active (Ctrl-C): stop the inference thread before the publishers.
        self._stop_io()
        # What configure froze, this node's and whatever else the process held then, can
        # be collected again once the node is gone (a process hosting other nodes goes on).
        gc.unfreeze()
        super().destroy_node()

    def _stop_io(self) -> None:
        if self._image_input is not None:
            # The frame in progress is finished (and published while still active).
            self._image_input.stop()
            self.destroy_subscription(self._info_sub)
            self.destroy_timer(self._diagnostics_timer)
            self._image_input = self._info_sub = self._diagnostics_timer = None

    def _load_perception(self) -> Any:
        # Imported here, so `--help` and parameter errors answer at once. torch is imported
        # only where the start needs it (loading.py): not from a checked ONNX export.
        from uq_perception.ntk import LastLayerNTKGP
        from uq_perception.perception import UncertaintyPerception
        from uq_perception.runtime.loading import load_model, start_detector
        from uq_perception.runtime.memory_tuning import retain_freed_memory
        from uq_perception.teaching import load_learnt_state
        from uq_perception.track_evidence import TrackEvidence
        from uq_perception.tracking import IoUTracker

        p = self._params
        if not retain_freed_memory():
            self.get_logger().info('allocator thresholds unchanged (no glibc mallopt): '
                                   'inference may page-fault more on each frame')
        model = load_model(p['model_format'], p['model_path'], self._runtime, self._adapter)
        gp = LastLayerNTKGP.load(p['gp_path'], feature_dim=model.feature_dim,
                                 model_id=model.model_id or None)
        learnt = load_learnt_state(gp, self._learned_gp_path(gp.model_id))
        if learnt.problem:
            self.get_logger().warning(learnt.message)
        else:
            self.get_logger().info(learnt.message)
        gp = learnt.gp
        backend, fallback = start_detector(model, self._runtime, gp)
        if fallback:
            self.get_logger().warning(fallback)
        self._backend_name = backend.backend_name
        if self._backend_name != BackendKind.PYTORCH_CPU.value and p['warmup_frames'] > 0:
            seconds = backend.warm_up(p['warmup_frames'])
            self.get_logger().info(f'warmed up {self._backend_name} with '
                                   f'{p["warmup_frames"]} frames in {seconds:.2f} s')
        # A CUDA graph that could not be captured at warm-up leaves the network running
        # eagerly: said in the node's log (a later frame size's failure is the runner's log).
        graph_failure = getattr(backend, 'graph_failure', '')
        if graph_failure:
            self.get_logger().warning(f'CUDA graph capture failed, running eagerly: '
                                      f'{graph_failure}')
        self._model_id = gp.model_id
        self._device = backend.device_name
        self._learnt_save_path = learnt.save_to
        self._learnt_state_problem = learnt.problem
        self._learnt_state_source = learnt.source
        return UncertaintyPerception(backend, gp, p['score_threshold'], p['max_detections'],
                                     IoUTracker(p['tracking_iou']), _duplicates(p),
                                     TrackEvidence(_evidence_config(p)))

    def _learned_gp_path(self, model_id: str) -> Path | None:
        from uq_perception.teaching import default_learnt_state_path

        if not self._params['persist_learnt_state']:
            return None
        path = self._params['learned_gp_path']
        return Path(path).expanduser() if path else default_learnt_state_path(model_id)

    # --- teaching ----------------------------------------------------------------------
    def _on_teach(self, request: TeachObject.Request,
                  response: TeachObject.Response) -> TeachObject.Response:
        from uq_perception.teaching import teach

        perception = self._perception
        if perception is None:
            result_accepted, message, index = False, 'the detector is not configured', -1
        else:
            # A request applied before (a retry) must not wipe the evidence gathered since.
            repeated = request.request_id in perception.gp.applied_updates
            result = teach(perception.gp, request.request_id, request.label,
                           request.embedding, request.model_id, self._learnt_save_path,
                           self._params['label_trust'])
            result_accepted, message, index = result.accepted, result.message, result.class_index
            if result_accepted and not repeated:
                track = perception.evidence.label(request.embedding, request.label)
                if track is not None:
                    self.get_logger().info(f'request {request.request_id}: the evidence of '
                                           f'track {track} restarts from its labelled views')
        # rclpy ties a severity to each logging call site, hence two calls.
        if result_accepted:
            self.get_logger().info(message)
        else:
            self.get_logger().warn(message)
        response.accepted, response.message, response.class_index = (
            result_accepted, message, index)
        return response

    # --- parameters ------------------------------------------------------------------
    def _on_set_parameters(self, parameters: list) -> SetParametersResult:
        error = first_invalid(_SPECS, parameters)
        if error:
            return SetParametersResult(successful=False, reason=error)
        for parameter in parameters:
            if parameter.name in _SPECS:
                self._params[parameter.name] = parameter.value
        if self._perception is not None:
            self._perception.score_threshold = self._params['score_threshold']
            self._perception.max_detections = self._params['max_detections']
            self._perception.tracker.iou_threshold = self._params['tracking_iou']
            self._perception.evidence.config = _evidence_config(self._params)
            self._perception.duplicates = _duplicates(self._params)
        return SetParametersResult(successful=True)

    # --- data path -------------------------------------------------------------------
    def _reset_stats(self) -> None:
        self._stats = RollingStats()
        self._last_sequence: int | None = None
        self._last_arrival: float | None = None
        self._last_problem = ''
        self._camera_info_size: tuple[int, int] | None = None
        self._size_mismatch = ''

    def _on_camera_info(self, msg: CameraInfo) -> None:
        # A zero width or height means an uncalibrated camera (sensor_msgs/CameraInfo):
        # there is no size to check against.
        self._camera_info_size = (msg.height, msg.width) if msg.height and msg.width else None

    def _check_size(self, msg: ImageFields) -> None:
        expected = self._camera_info_size
        if expected is None or (msg.height, msg.width) == expected:
            return
        self._stats.increment('size_mismatches')
        self._size_mismatch = (f'image size {msg.width}x{msg.height} differs from camera_info '
                               f'{expected[1]}x{expected[0]}: the intrinsics do not describe '
                               'the image')
        # A wrong camera_info usually persists: diagnostics carry it at every period, the
        # log only now and then.
        self.get_logger().warning(self._size_mismatch, throttle_duration_sec=10.0)

    def _on_image(self, serialized: bytes, info: dict, taken_ns: int) -> None:
        arrival, callback_start_ns = time.monotonic(), time.time_ns()
        # A frame's latency runs from its DDS reception stamp (system clock), so it includes
        # waiting to be taken; from the callback's start when the stamp is missing.
        try:
            self._process(serialized, info.get('received_timestamp') or callback_start_ns,
                          taken_ns)
        except Exception as exc:
            if not self.context.ok():
                return  # shut down (Ctrl-C) during this frame: its answer cannot go out
            # Anything unforeseen must not end the thread silently and stop the node.
            self._stats.increment('errors')
            self._last_problem = f'frame processing failed: {exc!r}'
            self.get_logger().error(self._last_problem, throttle_duration_sec=1.0)
        # Bookkeeping once the answer is out, so it adds nothing to its latency.
        self._stats.record_arrival(arrival)
        self._last_arrival = arrival
        self._count_dropped(info.get('publication_sequence_number'))
        self._record_delivery(info, callback_start_ns, taken_ns)

    def _process(self, serialized: bytes, received_ns: int, taken_ns: int) -> None:
        try:
            msg = image_fields(serialized)
            # A view of the taken buffer, not a copy: nothing writes to it.
            rgb = image_to_rgb(msg.height, msg.width, msg.encoding, msg.step, msg.data,
                               msg.is_bigendian, self._params['max_image_pixels'], copy=False)
        except ImageFormatError as exc:
            self._stats.increment('rejected')
            self._last_problem = f'rejected frame: {exc}'
            self.get_logger().warning(self._last_problem, throttle_duration_sec=1.0)
            return
        self._check_size(msg)
        converted_ns = time.time_ns()
        try:
            frame = self._perception.process(rgb, msg.stamp_sec + msg.stamp_nanosec * 1e-9)
        except (ValueError, RuntimeError) as exc:
            self._stats.increment('errors')
            self._last_problem = f'inference failed: {exc}'
            self.get_logger().error(self._last_problem, throttle_duration_sec=1.0)
            return
        header = self._header
        header.stamp.sec, header.stamp.nanosec = msg.stamp_sec, msg.stamp_nanosec
        header.frame_id = msg.frame_id
        built_start_ns = time.time_ns()
        # Published before the next frame is built, so its message objects can be reused.
        detections = self._detection_builder.build(
            frame, header, self._backend_name, self._model_id,
            self._params['publish_embeddings'])
        built_ns = time.time_ns()
        self._outputs['detections'].publish(detections)
        published_ns = time.time_ns()
        latency_ms = (published_ns - received_ns) * 1e-6
        self._stats.increment('processed')
        self._stats.record_latency(latency_ms)
        # Everything the node adds to the network's forward pass on this frame, timed in
        # one process on one frame (a forward timed in another process differed by up to 6 %).
        self._stats.record_latency(frame.forward_ms, 'forward')
        self._stats.record_latency(latency_ms - frame.forward_ms, 'overhead')
        resize_ms = 0.0 if math.isnan(frame.resize_ms) else frame.resize_ms
        self._record_stages({
            'receive_convert': (converted_ns - taken_ns) * 1e-6,
            'resize_normalise': frame.resize_ms, 'forward': frame.forward_ms - resize_ms,
            'gp': frame.gp_ms, 'duplicates_tracking': frame.tracking_ms,
            'message': (built_ns - built_start_ns) * 1e-6,
            'publish': (published_ns - built_ns) * 1e-6})
        standard = self._outputs.get('detections_2d')
        if standard is not None and standard.get_subscription_count():
            standard.publish(self._detection_2d_builder.build(frame, header))
        ood_threshold = self._perception.gp.ood_threshold
        if self._outputs['markers'].get_subscription_count():
            self._outputs['markers'].publish(
                marker_array_message(frame, header, ood_threshold))
        if self._outputs['overlay'].get_subscription_count():
            from uq_perception.overlay import draw_overlay
            self._outputs['overlay'].publish(Image(
                header=header, **rgb_to_image_fields(draw_overlay(rgb, frame,
                                                                  ood_threshold))))

    def _record_stages(self, stages: dict[str, float]) -> None:
        for name, milliseconds in stages.items():
            if not math.isnan(milliseconds):
                self._stats.record_latency(milliseconds, f'stage:{name}')

    def _record_delivery(self, info: dict, callback_start_ns: int, taken_ns: int) -> None:
        # DDS stamps when the publisher wrote the frame and when it reached this process
        # (system clock, shared by processes on one host): the latency before the callback
        # splits into transport and waiting for the executor to dispatch it.
        source, received = info.get('source_timestamp'), info.get('received_timestamp')
        if source and received:
            self._stats.record_latency((received - source) * 1e-6, 'transport')
            self._stats.record_latency((callback_start_ns - received) * 1e-6, 'dispatch')
        if source:
            self._stats.record_latency((taken_ns - source) * 1e-6, 'stage:transport')

    def _count_dropped(self, sequence: int | None) -> None:
        # DDS publication sequence numbers grow by one per message of a publisher; a gap
        # means frames the depth-1 queue overwrote while we were busy (or lost in
        # transit on best effort). A reset (new publisher) is not counted.
        if sequence:
            if self._last_sequence is not None and sequence > self._last_sequence + 1:
                self._stats.increment('dropped', sequence - self._last_sequence - 1)
            self._last_sequence = sequence

    def _publish_diagnostics(self) -> None:
        now = time.monotonic()
        p50, p99 = self._stats.latency_percentiles(50, 99)
        transport_p50, = self._stats.latency_percentiles(50, stage='transport')
        dispatch_p50, = self._stats.latency_percentiles(50, stage='dispatch')
        forward_p50, = self._stats.latency_percentiles(50, stage='forward')
        overhead_p50, overhead_p99 = self._stats.latency_percentiles(50, 99, stage='overhead')
        counters = self._stats.counters
        gp = self._perception.gp
        reference = gp.score_reference
        level, message = DiagnosticStatus.OK, 'processing images'
        if self._last_arrival is None or now - self._last_arrival > \
                self._params['stale_input_timeout']:
            level, message = DiagnosticStatus.WARN, 'no images received (stale input)'
        if self._reference_problem:
            level, message = DiagnosticStatus.WARN, self._reference_problem
        if self._learnt_state_problem:
            level, message = DiagnosticStatus.WARN, self._learnt_state_problem
        if self._size_mismatch:
            level, message = DiagnosticStatus.WARN, self._size_mismatch
            self._size_mismatch = ''
        if self._last_problem:
            level, message = DiagnosticStatus.WARN, self._last_problem
            self._last_problem = ''
        stages = {}
        for name in FRAME_STAGES:
            stage_p50, stage_p99 = self._stats.latency_percentiles(50, 99, stage=f'stage:{name}')
            stages[f'stage_{name}_p50_ms'] = f'{stage_p50:.3f}'
            stages[f'stage_{name}_p99_ms'] = f'{stage_p99:.3f}'
        values = {
            'input_rate_hz': f'{self._stats.rate_hz(now):.2f}',
            'latency_p50_ms': f'{p50:.2f}', 'latency_p99_ms': f'{p99:.2f}',
            'transport_p50_ms': f'{transport_p50:.2f}', 'dispatch_p50_ms': f'{dispatch_p50:.2f}',
            'forward_p50_ms': f'{forward_p50:.2f}',
            'overhead_p50_ms': f'{overhead_p50:.2f}', 'overhead_p99_ms': f'{overhead_p99:.2f}',
            'frames_processed': str(counters.get('processed', 0)),
            'frames_dropped': str(counters.get('dropped', 0)),
            'frames_rejected': str(counters.get('rejected', 0)),
            'inference_errors': str(counters.get('errors', 0)),
            'backend': self._backend_name, 'device': self._device,
            'model_id': self._model_id,
            'camera_info': ('x'.join(map(str, self._camera_info_size[::-1]))
                            if self._camera_info_size else 'none'),
            'camera_info_mismatches': str(counters.get('size_mismatches', 0)),
            'learnt_state': self._learnt_state_problem or (
                f'saved to {self._learnt_save_path}' if self._learnt_save_path
                else 'in memory only'),
            'learnt_state_source': self._learnt_state_source,
            'labels_learnt': str(len(gp.applied_updates)),
            'score_reference': (
                f'{reference.count} known objects of {reference.split}, largest variance '
                f'{reference.maximum:.4g}' if reference is not None
                else 'none: calibrated_score is -1'),
            **stages,
        }
        status = DiagnosticStatus(
            level=level, name=f'{self.get_name()}: uncertainty detector', message=message,
            hardware_id=self._device,
            values=[KeyValue(key=k, value=v) for k, v in values.items()])
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self._outputs['diagnostics'].publish(array)


def main(args: list[str] | None = None) -> int:
    """Run the node until shut down; returns the exit code (1 for an invalid configuration)."""
    parser = node_argument_parser(
        NODE_NAME, __doc__.split('\n\n')[0], PARAMETERS, 'config/detector.yaml',
        'topics: sub image, camera_info; pub detections, detections_2d (vision_msgs), overlay, '
        'markers, /diagnostics. '
        'Remap with --ros-args -r from:=to.')
    return run_node(DetectorNode, parser, args)


if __name__ == '__main__':
    sys.exit(main())
