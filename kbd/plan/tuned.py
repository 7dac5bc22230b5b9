"""Tuned configurations: what identifies a tuning task, and the configurations adopted for
tasks, as the finder applies them.

A task key holds everything a timing depends on: the schedule (its descriptor, the hash of its
resolved default stages, which carry every transform script's text), the kernel (its source,
element type, input shapes and constructor arguments: two problems with the same inputs may
convolve with different strides), the architecture, CPU features and model, the threads per
worker, and the torch-mlir version. The finder applies a tuned configuration on an exact key
match only.

Tuned configurations come from the results store (`kbd tune`, or `kbd tune --import FILE`) and
from the repository's reviewed `schedules/tuned.jsonl`, one JSON object per line, what
`kbd tune --export` writes. Pure Python and torch-free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec

from kbd.plan.catalog import Entry
from kbd.plan.space import Config
from kbd.shared import identity
from kbd.shared.errors import InputError
from kbd.shared.protocol import Stage

REPOSITORY_FILE = "tuned.jsonl"  # under schedules/


class TaskKey(msgspec.Struct, frozen=True, kw_only=True):
    descriptor: str  # relative to schedules/, e.g. x86_64/avx512f/matmul/f32.yaml
    schedule_hash: str  # the default configuration's resolved stages
    dtype: str
    inputs: list[str]  # the kernel's input shapes, e.g. ["1024x1024", "1024x1024"]
    init_args: str  # its constructor's arguments (a convolution's kernel size, stride, ...)
    source: str  # hash of the problem's source: the ops around the tuned one, their order
    arch: str
    features: list[str]
    cpu: str
    threads: int
    torch_mlir: str

    def hash(self) -> str:
        return hashlib.sha256(msgspec.json.encode(self)).hexdigest()[:16]


class Tuned(msgspec.Struct, frozen=True, kw_only=True):
    """The configuration adopted for a task: its confirmed best, or the default when no
    configuration beat it in fresh processes (`adopted` False)."""

    key: TaskKey
    kernel: str  # the kernel it was tuned on (information: the key is what matches)
    config: Config
    adopted: bool
    gain: float | None = None  # adopted over default, in fresh processes
    gain_low: float | None = None
    note: str = ""


def config_text(config: Config) -> str:
    """A configuration as canonical JSON (sorted names): how the store compares them."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def stages_hash(stages: list[Stage]) -> str:
    """A hash of what the stages do: each pass's spec and each transform script's text (its
    variables substituted), not the files' paths, which differ between checkouts (keyed by
    them, the repository's tuned configurations applied only where they were tuned)."""
    content = [
        (stage.kind, stage.text if stage.kind == "pass" else stage.script) for stage in stages
    ]
    return hashlib.sha256(msgspec.msgpack.encode(content)).hexdigest()[:16]


def task_key(
    entry: Entry,
    descriptor: str,
    default_stages: list[Stage],
    source: str,
    *,
    arch: str,
    features: list[str],
    cpu: str,
    threads: int,
) -> TaskKey:
    """The key of tuning `entry` under `descriptor` (relative to schedules/) on this target."""
    return TaskKey(
        descriptor=descriptor,
        schedule_hash=stages_hash(default_stages),
        dtype=entry.dtype,
        inputs=[_describe(i) for i in entry.inputs],
        init_args=repr(entry.init_args),
        source=hashlib.sha256(source.encode()).hexdigest()[:16],
        arch=arch,
        features=list(features),
        cpu=cpu,
        threads=threads,
        torch_mlir=identity.current().torch_mlir,
    )


def _describe(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        dims = "x".join(str(d) for d in shape.dims) or "scalar"
        return f"{dims}:{shape.dtype}"
    return repr(getattr(value, "value", value))


def read_jsonl(path: Path) -> list[Tuned]:
    """Tuned configurations from a JSON Lines file (`kbd tune --export`'s format)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            found.append(msgspec.json.decode(line, type=Tuned))
        except msgspec.ValidationError as exc:
            raise InputError(f"{path}: line {number}: {exc}") from None
        except msgspec.DecodeError:
            raise InputError(f"{path}: line {number}: not JSON") from None
    return found


def jsonl(tuned: list[Tuned]) -> str:
    return "".join(msgspec.json.encode(t).decode() + "\n" for t in tuned)


def lookup(tuned: list[Tuned]) -> dict[str, Config]:
    """Adopted configurations by task key hash (later entries win)."""
    return {t.key.hash(): t.config for t in tuned if t.adopted}
