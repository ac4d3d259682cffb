"""Scripted labeller node: a simulated person who answers help requests with the ground truth.

Adapts :class:`uq_sim.scripted_labeller.ScriptedLabeller` to ROS:

- ``help_request`` (uq_msgs/HelpRequest, in; reliable + transient local, as the ask-for-help
  node publishes it, so requests raised before this node started are answered too);
- ``ground_truth`` (uq_msgs/DetectionArray, in; reliable, from ``sim_camera_node``, same
  stamp as the image the detections were made on);
- ``provide_label`` (uq_msgs/ProvideLabel, client): the answer, ``answer_delay_s`` after the
  request arrived, with labeler ``labeler``; an answer with no response within
  ``response_timeout_s`` is sent again (the ask-for-help node stores a repeated answer once).

A request the labeller refuses (an id the label store would refuse, a non-finite or empty
box, too many waiting: :meth:`uq_sim.scripted_labeller.ScriptedLabeller.add_request`) is
dropped, counted and warned about (throttled); it is never answered.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import ParameterSpec, declare_parameters, first_invalid
from uq_common.qos import HELP_REQUEST_QOS
from uq_common.service_calls import ResendingCalls
from uq_msgs.msg import DetectionArray, HelpRequest
from uq_msgs.srv import ProvideLabel
from uq_sim.scripted_labeller import (
    NO_MATCH_POLICIES,
    LabelAnswer,
    LabellerConfig,
    ScriptedLabeller,
    TruthObject,
)

NODE_NAME = 'scripted_labeller_node'
_DEFAULT = LabellerConfig()


def _not_empty(value: str) -> str | None:
    return None if value.strip() else 'must not be empty'


PARAMETERS = [
    ParameterSpec('answer_delay_s', _DEFAULT.answer_delay_s,
                  'Seconds between receiving a request and answering it.',
                  min_value=0.0, max_value=3600.0),
    ParameterSpec('min_iou', _DEFAULT.min_iou, 'Least IoU between the request\'s box and a '
                  'ground-truth object for the object to be the one asked about.',
                  min_value=1e-6, max_value=1.0),
    ParameterSpec('truth_timeout_s', _DEFAULT.truth_timeout_s, 'How long an answer waits for '
                  'the ground truth of its stamp after its delay.', min_value=0.0,
                  max_value=600.0),
    ParameterSpec('no_match', _DEFAULT.no_match, 'A request on no ground-truth object: ignore '
                  '(log it, answer nothing) or label (answer no_match_label).',
                  choices=list(NO_MATCH_POLICIES)),
    ParameterSpec('no_match_label', _DEFAULT.no_match_label, 'The answer when no_match is '
                  'label.', check=_not_empty),
    ParameterSpec('labeler', 'scripted', 'Labeler name sent with every answer.',
                  check=_not_empty),
    ParameterSpec('truth_buffer', _DEFAULT.truth_buffer, 'Ground-truth frames kept by stamp.',
                  min_value=1, max_value=100000, read_only=True),
    ParameterSpec('service', 'provide_label', 'The ask-for-help node\'s ProvideLabel service.',
                  read_only=True, check=_not_empty),
    ParameterSpec('period_s', 0.05, 'How often due answers are sent, seconds.',
                  min_value=0.005, max_value=10.0, read_only=True),
    ParameterSpec('response_timeout_s', 5.0, 'Seconds without a response after which an '
                  'answer is sent again.', min_value=0.1, max_value=3600.0, read_only=True),
]
_SPECS = {spec.name: spec for spec in PARAMETERS}
TRUTH_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=50,
                       reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.VOLATILE)


def labeller_config(values: dict[str, Any]) -> LabellerConfig:
    """The labeller's configuration from parameter values (ValueError naming a bad one)."""
    return LabellerConfig(answer_delay_s=values['answer_delay_s'], min_iou=values['min_iou'],
                          truth_timeout_s=values['truth_timeout_s'],
                          no_match=values['no_match'],
                          no_match_label=values['no_match_label'],
                          truth_buffer=values['truth_buffer'])


def truth_objects(msg: DetectionArray) -> list[TruthObject]:
    """The ground-truth objects of a ``ground_truth`` message (``class_index`` -1: unknown)."""
    return [TruthObject(d.track_id, d.class_id, d.class_index >= 0,
                        (d.center_x, d.center_y, d.width, d.height)) for d in msg.detections]


def _stamp_ns(stamp: Any) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


class ScriptedLabellerNode(Node):
    """Answers every help request with the ground-truth class, after a delay."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._params = declare_parameters(self, PARAMETERS)
        self._labeller = ScriptedLabeller(labeller_config(self._params))
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._client = self.create_client(ProvideLabel, self._params['service'])
        self._calls = ResendingCalls(self._client, self._params['response_timeout_s'])
        self._unsent: list[LabelAnswer] = []
        self._refused = 0
        self.create_subscription(HelpRequest, 'help_request', self._on_request, HELP_REQUEST_QOS)
        self.create_subscription(DetectionArray, 'ground_truth', self._on_truth, TRUTH_QOS)
        self.create_timer(self._params['period_s'], self._on_timer)
        self.get_logger().info(f'answering help requests with the ground truth after '
                               f'{self._params["answer_delay_s"]} s as '
                               f'{self._params["labeler"]!r}')

    def _on_set_parameters(self, parameters: list) -> SetParametersResult:
        error = first_invalid(_SPECS, parameters)
        values = dict(self._params)
        values.update({p.name: p.value for p in parameters if p.name in _SPECS})
        if error is None:
            try:
                config = labeller_config(values)
            except ValueError as exc:
                error = str(exc)
        if error:
            return SetParametersResult(successful=False, reason=error)
        self._params = values
        self._labeller.config = config
        return SetParametersResult(successful=True)

    def _on_truth(self, msg: DetectionArray) -> None:
        self._labeller.add_ground_truth(_stamp_ns(msg.header.stamp), truth_objects(msg))

    def _on_request(self, msg: HelpRequest) -> None:
        d = msg.detection
        try:
            added = self._labeller.add_request(msg.request_id, _stamp_ns(msg.header.stamp),
                                               (d.center_x, d.center_y, d.width, d.height),
                                               time.monotonic())
        except ValueError as exc:
            self._refused += 1
            self.get_logger().warning(f'help request refused ({self._refused} so far): {exc}',
                                      throttle_duration_sec=5.0)
            return
        if added:
            # The reason is shown as a cut-short repr: it may be huge or hold newlines.
            self.get_logger().info(f'request {msg.request_id}: {msg.reason!r:.200}')

    def _on_timer(self) -> None:
        for answer in self._labeller.due(time.monotonic()):
            if answer.label is None:
                self.get_logger().warn(f'request {answer.request_id} not answered: '
                                       f'{answer.why}')
            else:
                self._unsent.append(answer)
        for request_id, attempt in self._calls.resend_overdue():
            self.get_logger().warn(f'no response to the answer to {request_id}; sent again '
                                   f'(attempt {attempt})')
        if not self._unsent:
            return
        if not self._client.service_is_ready():
            self.get_logger().warn(f'{len(self._unsent)} answers wait for the '
                                   f'{self._params["service"]} service',
                                   throttle_duration_sec=5.0)
            return
        for answer in self._unsent:
            request = ProvideLabel.Request(request_id=answer.request_id, label=answer.label,
                                           labeler=self._params['labeler'])
            self._calls.send(answer.request_id, request,
                             lambda f, a=answer: self._on_answered(a, f))
        self._unsent = []

    def _on_answered(self, answer: LabelAnswer, future: Any) -> None:
        try:
            response = future.result()
        except Exception as exc:  # transport failure: the answer is logged as lost
            self.get_logger().error(f'answer to {answer.request_id} failed: {exc!r}')
            return
        if response.accepted:
            self.get_logger().info(f'answered {answer.request_id} with {answer.label!r} '
                                   f'({answer.why}): {response.message}')
        else:
            self.get_logger().warn(f'answer {answer.label!r} to {answer.request_id} refused: '
                                   f'{response.message}')


def main(args: list[str] | None = None) -> int:
    """Run the node (``--help`` lists the parameters without starting ROS)."""
    parser = node_argument_parser(
        NODE_NAME, __doc__.split('\n\n')[0], PARAMETERS, 'config/scripted_labeller.yaml',
        'topics: sub help_request, ground_truth; client provide_label.')
    return run_node(ScriptedLabellerNode, parser, args)


if __name__ == '__main__':
    sys.exit(main())
