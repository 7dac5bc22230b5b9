"""Final per-kernel records and how a worker's end is classified into one outcome."""

from __future__ import annotations

import re
import signal as signals

import msgspec

from kbd.plan.catalog import Expectation
from kbd.plan.limits import format_size
from kbd.results.stats import Benchmark
from kbd.shared.outcomes import Outcome, is_failure
from kbd.shared.protocol import Coverage, Job, Mode, Result, ShapesFrom, Tensor

LLVM_ERROR = re.compile(r"LLVM ERROR: .*")
# An LLVM abort that is an allocation failure. RuntimeDyld (the JIT's linker) says "Unable to
# allocate section memory!" when its memory manager's mmap fails: under --mem-limit, RLIMIT_DATA.
_LLVM_OOM = (
    "LLVM ERROR: out of memory",
    "Allocation failed",
    "std::bad_alloc",
    "LLVM ERROR: Unable to allocate section memory",
)


class Record(msgspec.Struct, kw_only=True):
    """How one kernel ended: what `kbd run --json` prints and the store keeps."""

    kernel: str
    mode: Mode = "import"
    dtype: str = "f32"  # the element type it ran in (--dtype, or its levels entry's)
    # Where its inputs came from: its levels entry ("levels"), or its problem's own
    # get_inputs() and get_init_inputs() ("kernelbench", --shapes kernelbench) ...
    shapes: ShapesFrom = "levels"
    # ...and what they were (`inputs_of`): DIMSxTYPExINIT per tensor as the levels entry gives
    # it, or DIMSxTYPE as sizing found it; a scalar's value. Empty when not known (the entry
    # gives none, or the kernel ended before it was sized).
    inputs: list[str] = []
    outcome: Outcome
    phase: str
    signal: str | None = None
    message: str = ""
    wall_s: float = 0.0
    # Of wall_s, how long the worker was paused while other kernels were timed alone
    # (kbd/bench/quiet.py): the phases it interrupted count that time too.
    paused_s: float = 0.0
    peak_rss_bytes: int | None = None
    passing_tolerance: float | None = None  # as in protocol.Result
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    times: dict[str, float] = {}
    limits: dict[str, str] = {}
    expected: str | None = None  # the xfail expectation, when the entry has one
    warning: str | None = None  # the entry's `warning`, shown before the kernel's line
    log: str | None = None
    import_cache: str | None = None  # "hit" or "miss" when the import cache was used
    compile_cache: str | None = None  # "hit", "miss" or "not cached: <why>" when it was used
    pipeline: str = ""  # the pipeline it ran with, and why when not its family schedule
    bench: Benchmark | None = None  # --benchmark figures of a kernel that passed
    not_benchmarked: str | None = None  # with --benchmark: why this kernel was not timed
    node: str | None = None  # the cluster node that ran it (`--cluster`); None = this machine
    coverage: Coverage | None = None  # compile mode: subgraphs, graph breaks, eager ops
    random_inputs: int = 0
    state_writes: list[str] = []
    bundle: str | None = None  # reproducer bundle of a failing pipeline stage (`kbd replay`)
    dumps: dict[str, str] = {}  # what --print-to/--object-file/--dump-assembly wrote: kind -> path

    @property
    def key(self) -> tuple[str, str]:
        """What identifies a record in a run: the kernel and the mode it ran in."""
        return self.kernel, self.mode

    @property
    def label(self) -> str:
        """The kernel, with the mode when it is not the default."""
        return label(self.kernel, self.mode)

    @property
    def failed(self) -> bool:
        """Does this record make the run fail (see the outcome table)?"""
        return is_failure(self.outcome)


def inputs_of(job: Job) -> list[str]:
    """The inputs a job runs with, as a record gives them (`Record.inputs`); the job is the one
    source: its levels entry's input specs, or the shapes sizing found."""
    if job.sized is not None:
        return list(job.sized.inputs)
    return [str(i.shape) if isinstance(i, Tensor) else str(i.value) for i in job.inputs or []]


def label(kernel: str, mode: str) -> str:
    return kernel if mode == "import" else f"{kernel} [{mode}]"


class Death(msgspec.Struct, kw_only=True):
    """What the supervisor observed about a worker that ended."""

    returncode: int | None  # None: never reaped (should not happen)
    last_phase: str
    timed_out: bool = False
    timeout_s: float | None = None
    memory_killed: bool = False
    mem_limit: int | None = None
    peak_rss_bytes: int | None = None
    llvm_error: str | None = None
    protocol_error: str | None = None


def classify(result: Result | None, death: Death) -> tuple[Outcome, str, str | None, str]:
    """(outcome, phase, signal name, message) from the worker's result and its death."""
    phase = result.phase if result else death.last_phase
    if death.timed_out:
        return "timeout", death.last_phase, None, f"no result after {death.timeout_s:g} s"
    if death.memory_killed:
        return "memory", death.last_phase, None, _memory_message(death)
    if result is not None:
        return result.outcome, result.phase, None, result.message
    if death.protocol_error:
        return "error", phase, None, f"worker protocol error: {death.protocol_error}"
    code = death.returncode
    if code is not None and code < 0:
        name = _signal_name(-code)
        if death.llvm_error and any(m in death.llvm_error for m in _LLVM_OOM):
            return "memory", phase, name, f"{death.llvm_error} ({_memory_message(death)})"
        if death.llvm_error:
            return "crash", phase, name, death.llvm_error
        return "crash", phase, name, f"worker killed by {name}"
    return "error", phase, None, f"worker exited with status {code} before reporting a result"


def expect(outcome: Outcome, phase: str, message: str, expectation: Expectation | None):
    """Apply an entry's expected failure: (final outcome, note for the message or None)."""
    if expectation is None:
        return outcome, None
    if outcome == "pass":
        return "xpass", f"expected to fail ({expectation}) but passed"
    if expectation.matches(outcome, phase, message):
        return "xfail", None
    return outcome, f"expected {expectation}"


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _memory_message(death: Death) -> str:
    parts = []
    if death.mem_limit is not None:
        parts.append(f"limit {format_size(death.mem_limit)}")
    if death.peak_rss_bytes:
        parts.append(f"peak {format_size(death.peak_rss_bytes)}")
    return ", ".join(parts) or "out of memory"
