"""Wire protocol: message round trips and framing over real sockets (blocking and anyio)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import anyio
import anyio.abc
import msgspec
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from kbd.shared.protocol import (
    MAX_FRAME,
    Exited,
    Job,
    Limits,
    Phase,
    ProtocolError,
    Ready,
    Result,
    Scalar,
    Spawn,
    Spawned,
    Stage,
    TemplateMessage,
    Tensor,
    WorkerMessage,
    decode,
    encode,
    frame_length,
    receive,
    receive_blocking,
    send_blocking,
)
from kbd.shared.shapes import Shape

JOB = Job(
    kernel="level1/5_Matrix_scalar_multiplication.py",
    source="/kb/level1/5_Matrix_scalar_multiplication.py",
    source_text="import torch\n\nclass Model(torch.nn.Module): ...\n",
    inputs=[Tensor(Shape((64, 512), "f32", "rnd")), Scalar(3.14), Scalar(2), Scalar(True)],
    init_args=[128, [128], 128],
    outputs=[Shape((64, 512), "f32"), Shape((), "f32")],
    dtype="f32",
    stages=[
        Stage("pass", "convert-linalg-to-loops{opt=1}", "schedules/a.yaml"),
        Stage("transform", "/abs/tile.mlir", "cli", script="module {}"),
    ],
    seed=42,
    tolerance=1e-4,
    max_tolerance=0.1,
    opt_level=3,
    limits=Limits(cores=(0, 2), mem_limit=1 << 30),
)
RESULT = Result(
    outcome="mismatch",
    phase="check",
    message="max abs error 0.05",
    passing_tolerance=0.1,
    max_abs_error=0.05,
    max_rel_error=0.05,
    times={"import": 0.5, "jit": 1.25},
    limits_enforced={"RLIMIT_DATA": "1 GiB"},
)


def payload(frame: bytes) -> bytes:
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    return frame[4:]


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


# --- encode / decode -------------------------------------------------------------------------


def test_job_round_trip():
    decoded = decode(payload(encode(JOB)), Job)
    assert decoded == JOB
    assert type(decoded.inputs[0]) is Tensor
    assert type(decoded.inputs[1].value) is float
    assert type(decoded.inputs[2].value) is int
    assert decoded.inputs[3].value is True
    assert decoded.limits.cores == (0, 2)


def test_job_with_defaults_round_trip():
    job = msgspec.structs.replace(JOB, inputs=None, init_args=None, outputs=None, limits=Limits())
    decoded = decode(payload(encode(job)), Job)
    assert decoded == job
    assert decoded.limits.mem_limit is None


def test_job_tuple_init_args_come_back_as_list():
    job = msgspec.structs.replace(JOB, init_args=(1, 2))
    assert decode(payload(encode(job)), Job).init_args == [1, 2]


def test_worker_messages_round_trip():
    assert decode(payload(encode(Phase("pipeline:canonicalize"))), WorkerMessage) == Phase(
        "pipeline:canonicalize"
    )
    assert decode(payload(encode(RESULT)), WorkerMessage) == RESULT
    minimal = Result(outcome="pass", phase="check")
    assert decode(payload(encode(minimal)), WorkerMessage) == minimal


def test_template_messages_round_trip():
    for message in (Spawned(3, 1234), Exited(1234, -11, 5 << 20), Ready()):
        assert decode(payload(encode(message)), TemplateMessage) == message
    assert decode(payload(encode(Spawn(7))), Spawn) == Spawn(7)


def test_stage_name():
    assert JOB.stages[0].name == "convert-linalg-to-loops"
    assert JOB.stages[1].name == "tile.mlir"


def test_decode_wrong_kind_is_protocol_error():
    with pytest.raises(ProtocolError, match="undecodable frame"):
        decode(payload(encode(Phase("run"))), Job)


def test_decode_bad_outcome_is_protocol_error():
    bad = msgspec.msgpack.encode({"type": "result", "outcome": "great", "phase": "run"})
    with pytest.raises(ProtocolError):
        decode(bad, WorkerMessage)


def test_decode_garbage_is_protocol_error():
    with pytest.raises(ProtocolError):
        decode(b"\xc1\xc1\xc1", WorkerMessage)


def test_encode_oversized_frame():
    with pytest.raises(ProtocolError, match="exceeds"):
        encode(Phase("x" * (MAX_FRAME + 1)))


def test_frame_length():
    assert frame_length(struct.pack(">I", 0)) == 0
    assert frame_length(struct.pack(">I", MAX_FRAME)) == MAX_FRAME
    with pytest.raises(ProtocolError, match="announced"):
        frame_length(struct.pack(">I", MAX_FRAME + 1))


# --- blocking sockets ------------------------------------------------------------------------


def test_send_and_receive_blocking(pair):
    a, b = pair
    send_blocking(a, JOB)
    send_blocking(a, Phase("load"))
    send_blocking(a, RESULT)
    assert receive_blocking(b, Job) == JOB
    assert receive_blocking(b, WorkerMessage) == Phase("load")
    assert receive_blocking(b, WorkerMessage) == RESULT


def test_frame_split_over_several_sends(pair):
    a, b = pair
    frame = encode(JOB)
    pieces = [frame[:1], frame[1:3], frame[3:6], frame[6:20], frame[20:]]
    assert all(pieces)

    def dribble():
        for piece in pieces:
            a.sendall(piece)
            time.sleep(0.01)

    thread = threading.Thread(target=dribble)
    thread.start()
    try:
        assert receive_blocking(b, Job) == JOB
    finally:
        thread.join()


def test_eof_before_frame(pair):
    a, b = pair
    a.close()
    with pytest.raises(EOFError):
        receive_blocking(b, WorkerMessage)


def test_eof_inside_frame(pair):
    a, b = pair
    frame = encode(RESULT)
    a.sendall(frame[:-3])
    a.close()
    with pytest.raises(EOFError):
        receive_blocking(b, WorkerMessage)


def test_eof_inside_header(pair):
    a, b = pair
    a.sendall(b"\x00\x00")
    a.close()
    with pytest.raises(EOFError):
        receive_blocking(b, WorkerMessage)


def test_oversized_length_rejected_before_payload(pair):
    a, b = pair
    # Only the header and a marker are sent: reading the announced payload would block
    # until the 5 s timeout (socket.timeout, not ProtocolError) and consume the marker.
    a.sendall(struct.pack(">I", MAX_FRAME + 1) + b"marker")
    with pytest.raises(ProtocolError, match="announced"):
        receive_blocking(b, WorkerMessage)
    assert b.recv(64) == b"marker"


def test_garbage_payload(pair):
    a, b = pair
    a.sendall(struct.pack(">I", 4) + b"\xc1\xff\x00\x13")
    with pytest.raises(ProtocolError, match="undecodable frame"):
        receive_blocking(b, WorkerMessage)


def test_empty_payload(pair):
    a, b = pair
    a.sendall(struct.pack(">I", 0))
    with pytest.raises(ProtocolError):
        receive_blocking(b, WorkerMessage)


# --- anyio -----------------------------------------------------------------------------------


def receive_async(sock: socket.socket, kind, count: int) -> list:
    async def main():
        stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
        async with stream:
            buffered = BufferedByteReceiveStream(stream)
            return [await receive(buffered, kind) for _ in range(count)]

    return anyio.run(main)


def test_async_receive(pair):
    a, b = pair
    a.sendall(encode(Phase("load")) + encode(Phase("import")) + encode(RESULT))
    assert receive_async(b, WorkerMessage, 3) == [Phase("load"), Phase("import"), RESULT]


def test_async_receive_split_frame(pair):
    a, b = pair
    frame = encode(JOB)

    def dribble():
        for i in range(0, len(frame), 7):
            a.sendall(frame[i : i + 7])
            time.sleep(0.002)

    thread = threading.Thread(target=dribble)
    thread.start()
    try:
        assert receive_async(b, Job, 1) == [JOB]
    finally:
        thread.join()


def test_async_receive_end_of_stream(pair):
    a, b = pair
    a.sendall(encode(Phase("run")) + encode(RESULT)[:5])
    a.close()

    async def main():
        stream = await anyio.abc.UNIXSocketStream.from_socket(b)
        async with stream:
            buffered = BufferedByteReceiveStream(stream)
            assert await receive(buffered, WorkerMessage) == Phase("run")
            with pytest.raises((anyio.EndOfStream, anyio.IncompleteRead)):
                await receive(buffered, WorkerMessage)

    anyio.run(main)


def test_async_receive_oversized_and_garbage(pair):
    a, b = pair
    a.sendall(struct.pack(">I", 2) + b"\xc1\xc1" + struct.pack(">I", MAX_FRAME + 1))

    async def main():
        stream = await anyio.abc.UNIXSocketStream.from_socket(b)
        async with stream:
            buffered = BufferedByteReceiveStream(stream)
            with pytest.raises(ProtocolError, match="undecodable"):
                await receive(buffered, WorkerMessage)
            with anyio.fail_after(5):
                with pytest.raises(ProtocolError, match="announced"):
                    await receive(buffered, WorkerMessage)

    anyio.run(main)
