"""Bags are interchangeable between rclpy and `rosbags`: a message serialised by rclpy and
written to a rosbag2 file deserialises with `rosbags` (types registered from our own .msg
files) to equal fields, and the reverse, for both storage formats (sqlite3, MCAP)."""

from __future__ import annotations

import array

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from rosbags.rosbag2 import Reader, StoragePlugin, Writer

from uq_eval.bags.types import uq_typestore
from uq_msgs.msg import AutonomyState, Detection, DetectionArray, HelpRequest, Uncertainty

MESSAGE_TYPES = [Uncertainty, Detection, DetectionArray, AutonomyState, HelpRequest]
STORAGES = [StoragePlugin.SQLITE3, StoragePlugin.MCAP]


def _type_name(msg_type: type) -> str:
    return f'uq_msgs/msg/{msg_type.__name__}'


def _assert_same_fields(rclpy_msg, rosbags_msg, path: str = '') -> None:
    """Compare an rclpy message and a rosbags dataclass field by field, recursively."""
    for field in rclpy_msg.get_fields_and_field_types():
        ours, theirs = getattr(rclpy_msg, field), getattr(rosbags_msg, field)
        where = f'{path}.{field}'
        if hasattr(ours, 'get_fields_and_field_types'):
            _assert_same_fields(ours, theirs, where)
        elif isinstance(ours, list | tuple) and ours and hasattr(
                ours[0], 'get_fields_and_field_types'):
            assert len(ours) == len(theirs), where
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                _assert_same_fields(a, b, f'{where}[{i}]')
        elif isinstance(ours, bytes | bytearray | list | tuple | np.ndarray | array.array):
            np.testing.assert_array_equal(np.asarray(list(ours)), np.asarray(theirs),
                                          err_msg=where)
        else:
            assert ours == theirs, f'{where}: {ours!r} != {theirs!r}'


@pytest.fixture(scope='module')
def typestore():
    return uq_typestore()


@pytest.mark.parametrize('storage', STORAGES, ids=lambda s: s.name.lower())
def test_rclpy_written_bag_reads_with_rosbags(tmp_path, typestore, filled_message, storage):
    sent = {t: filled_message(t) for t in MESSAGE_TYPES}
    bag = tmp_path / 'from_rclpy'
    with Writer(bag, version=9, storage_plugin=storage) as writer:
        for i, (msg_type, msg) in enumerate(sent.items()):
            conn = writer.add_connection(f'/{msg_type.__name__.lower()}', _type_name(msg_type),
                                         typestore=typestore)
            writer.write(conn, 1_000 + i, serialize_message(msg))
    with Reader(bag) as reader:
        read = {c.msgtype: typestore.deserialize_cdr(raw, c.msgtype)
                for c, _, raw in reader.messages()}
    assert len(read) == len(MESSAGE_TYPES)
    for msg_type, msg in sent.items():
        _assert_same_fields(msg, read[_type_name(msg_type)], msg_type.__name__)


@pytest.mark.parametrize('storage', STORAGES, ids=lambda s: s.name.lower())
def test_rosbags_written_bag_reads_with_rclpy(tmp_path, typestore, filled_message, storage):
    expected = {t: filled_message(t) for t in MESSAGE_TYPES}
    bag = tmp_path / 'from_rosbags'
    with Writer(bag, version=9, storage_plugin=storage) as writer:
        for i, (msg_type, msg) in enumerate(expected.items()):
            # Build the rosbags-side message from the rclpy one via CDR, then serialise it
            # with rosbags' own serialiser: the bytes in the bag are rosbags'.
            theirs = typestore.deserialize_cdr(serialize_message(msg), _type_name(msg_type))
            conn = writer.add_connection(f'/{msg_type.__name__.lower()}', _type_name(msg_type),
                                         typestore=typestore)
            writer.write(conn, 1_000 + i, typestore.serialize_cdr(theirs, _type_name(msg_type)))
    by_name = {_type_name(t): t for t in MESSAGE_TYPES}
    with Reader(bag) as reader:
        read = {by_name[c.msgtype]: deserialize_message(raw, by_name[c.msgtype])
                for c, _, raw in reader.messages()}
    assert read == expected


def test_typestore_knows_every_field(typestore):
    """The rosbags definitions are built from the same .msg files: same field names."""
    for msg_type in MESSAGE_TYPES:
        _, fields = typestore.fielddefs[_type_name(msg_type)]
        assert [name for name, _ in fields] == list(
            msg_type.get_fields_and_field_types()), msg_type.__name__
