"""The frames of a message sent and received as pyzmq's multipart helpers would, with libzmq's flag values."""

import pytest

zmq = pytest.importorskip("zmq")

from lazyseq.serving.frames import (  # noqa: E402
    DONTWAIT,
    SNDMORE,
    has_message,
    receive_frames,
    receive_waiting,
    send_frames,
)


@pytest.fixture
def pair():
    context = zmq.Context()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    a.bind("inproc://test-frames")
    b.connect("inproc://test-frames")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)
    context.term()


def test_the_flags_are_libzmqs():
    assert (DONTWAIT, SNDMORE) == (zmq.DONTWAIT, zmq.SNDMORE) == (zmq.NOBLOCK, zmq.SNDMORE)


def test_messages_keep_their_frames_and_their_boundaries(pair):
    a, b = pair
    send_frames(a, [b"one"])
    send_frames(a, [b"two", bytearray(b"three"), memoryview(b"four")], copy=False)
    send_frames(b, [b"back", b"again"], DONTWAIT)
    assert [f.bytes for f in receive_frames(b, 0)] == [b"one"]
    assert [f.bytes for f in receive_frames(b, DONTWAIT)] == [b"two", b"three", b"four"]
    assert [f.bytes for f in receive_frames(a, 0)] == [b"back", b"again"]


def test_nothing_to_receive_without_waiting_is_again(pair):
    with pytest.raises(zmq.Again):
        receive_frames(pair[1], DONTWAIT)


def test_whether_a_message_waits_is_known_before_receiving(pair):
    a, b = pair
    assert not has_message(b)
    send_frames(a, [b"one", b"two"])
    send_frames(a, [b"three"])
    assert has_message(b)
    receive_frames(b, DONTWAIT)
    assert has_message(b)  # the second message
    receive_frames(b, DONTWAIT)
    assert not has_message(b)


def test_a_message_waiting_is_received_and_none_when_nothing_waits(pair):
    a, b = pair
    assert receive_waiting(b) is None
    send_frames(a, [b"one", b"two", b"three"])
    assert [f.bytes for f in receive_waiting(b, 2)] == [b"one", b"three"]  # (the most kept, as receive_frames)
    assert receive_waiting(b) is None


def test_frames_past_the_most_kept_are_read_and_dropped(pair):
    a, b = pair
    send_frames(a, [b"%d" % k for k in range(10_000)])
    send_frames(a, [b"next"])
    assert [f.bytes for f in receive_frames(b, 0, 3)] == [b"0", b"1", b"9999"]  # not 10,000 frames held by Python
    assert [f.bytes for f in receive_frames(b, 0, 3)] == [b"next"]


def test_the_first_frames_asked_for_come_copied_the_rest_not(pair):
    a, b = pair
    send_frames(a, [b"tag", b"kind", b"header", b"data", b"more"])
    send_frames(a, [b"alone"])
    copied = receive_frames(b, 0, copied=3)
    assert copied[:3] == [b"tag", b"kind", b"header"]  # bytes: no zmq.Frame to let go of (see receive_frames)
    assert [type(f) for f in copied[3:]] == [zmq.Frame, zmq.Frame]
    assert [f.bytes for f in copied[3:]] == [b"data", b"more"]
    assert receive_waiting(b, copied=3) == [b"alone"]  # a message shorter than that: not glued to the next
    assert receive_waiting(b, copied=3) is None
