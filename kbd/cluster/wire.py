"""Messages between the head and node agents, as msgspec bytes carried by Ray.

They live here rather than in kbd/shared/protocol.py because they carry an `Entry` and a
`Record`, which the shared contract cannot import. Ray only transports the bytes; nothing is
pickled but them.
"""

from __future__ import annotations

import msgspec

from kbd.plan.catalog import Entry
from kbd.plan.target import Machine
from kbd.results.record import Record
from kbd.shared.identity import Identity
from kbd.shared.protocol import Job, Phase


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent tells the head before it is used."""

    node: str  # "host/node-id-prefix", as records name it
    cores: tuple[int, ...]  # cores kbd may pin workers to on that node
    slots: int  # kernels the agent runs at once
    budget: int  # bytes of memory admission on that node
    identity: Identity  # kbd.shared.identity.current() there
    memory_monitor: bool  # Ray's memory monitor is on (it could kill kbd in place of kbd)
    niceness: int  # inherited by every kernel (Ray's default for workers is 15)
    machine: Machine  # its CPU: a tuning task there is keyed by it (kbd.cluster.tuning)
    threads: int  # cores per worker, the template's thread count


class Dispatch(msgspec.Struct, frozen=True, kw_only=True):
    """One kernel to run: its entry, its self-contained job and its predicted memory."""

    entry: Entry
    job: Job
    memory: int
    timeout: float


class Finished(msgspec.Struct, frozen=True, tag="finished"):
    """The kernel's record; the last event of a run."""

    record: Record


AgentEvent = Phase | Finished  # a run streams Phase heartbeats (the first one: accepted)

_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes, kind):
    return msgspec.msgpack.decode(data, type=kind)
