"""The messages between a loader and its worker processes survive encoding, packed or pickled."""

from __future__ import annotations

import numpy as np
import pytest

from lazyseq.loading.messages import PickledResult, RunTasks, SharedResult, Stop, Task, decode, encode


@pytest.mark.parametrize(
    ("tasks", "packed"),
    [
        ([Task(0, 0, -1), Task(7, 7, 3), Task(2**62, 2**62, 0)], True),  # prefetch: item i is task i
        ([Task(4, None, 1), Task(5, None, -1)], True),  # load_buffers: no argument
        ([], True),
        ([Task(1, 1, 0), Task(2, None, 0)], False),  # both kinds in one message
        ([Task(1, 2, 0)], False),  # an argument that is not the task
        ([Task(1, True, 0)], False),  # equal to the task, but a bool
        ([Task(2**63, 2**63, 0)], False),  # beyond 64 bits
        ([Task("a", "a", 0)], False),
        ([Task(np.int64(3), np.int64(3), 0)], False),
    ],
)
def test_tasks_come_back_equal_with_their_types(tasks, packed):
    raw = encode(RunTasks(tasks))
    assert (raw[0] != 0x80) is packed
    back = decode(raw)
    assert back == RunTasks(tasks)
    assert [tuple(map(type, task)) for task in back.tasks] == [tuple(map(type, task)) for task in tasks]


def test_a_result_in_a_slot_comes_back_equal_from_bytes_and_from_a_bytearray():
    skeleton = ("d", ("x", 1), [("a", 0), ("v", 1.5)])
    message = SharedResult(2**40, 3, skeleton, [("<f8", (256, 248), 0), ("<i8", (256,), 507904)], 1.25e-4)
    raw = encode(message)
    assert raw[:1] == b"s"
    assert decode(raw) == message
    assert decode(bytearray(raw)) == message
    assert type(decode(raw).skeleton[1][1]) is int


def test_other_messages_are_pickled():
    for message in (Stop(), PickledResult("k", -1, {"a": [1]}, 0, 0.5), SharedResult("k", 0, ("a", 0), [], 0.0)):
        raw = encode(message)
        assert raw[0] == 0x80
        assert decode(raw) == message


def test_an_unknown_message_kind_is_an_error():
    with pytest.raises(ValueError, match="^unknown message kind 0x7a$"):
        decode(b"z")
