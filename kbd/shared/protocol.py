"""The wire protocol of a supervisor with its template and workers, and the framing of sockets.

Frames are a 4-byte big-endian length followed by a msgpack payload. Two channels carry the
messages defined here:

- supervisor <-> worker, on a socketpair private to one kernel: the supervisor sends one task
  (a `Job`, a `Size` before the job of a kernel run at its problem's own shapes, a `Generate` for
  the levels generator, or a `Replay` for `kbd replay`); the worker answers `Phase` heartbeats
  (sent *before* each step, so a death is pinned to a phase) and one `Result` (or `Sized`,
  `Generated`); `Imported` and `Library` frames hand the supervisor what its caches
  keep, and `QuietGranted` answers the bench heartbeat of a job timed alone. The worker's
  stdout/stderr never carry frames.
- supervisor <-> template (the warm process that forks workers), on a Unix socket: `Spawn`
  (the worker's socket end travels with it as SCM_RIGHTS), answered by `Spawned` and, when the
  worker is reaped, `Exited`; `Ready` once the template accepts them.

The daemon's client <-> daemon messages use the same framing (`encode`, `receive`, ...) and are
defined beside the daemon, in kbd/daemon/wire.py, as they carry a `SweepSpec` and `Record`s.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Literal

import msgspec

from kbd.shared.outcomes import Outcome
from kbd.shared.shapes import Shape

MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")

Mode = Literal["import", "compile"]  # torch.export of the whole model, or torch.compile (Dynamo)
BenchLoop = Literal["jit", "python"]  # how --benchmark timed the compiled side (BenchSamples)

# The variables that set OpenMP's, MKL's and OpenBLAS's thread counts: the supervisor gives the
# template the cores per worker, and each worker its own pinned cores.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class ProtocolError(Exception):
    """A peer sent something that is not a valid frame."""


# --- phases ---------------------------------------------------------------------------------
# A worker names each step it starts in a `Phase` heartbeat, and its `Result` and the record
# keep the last one. These are the names the other side of a process boundary acts on, spelled
# here once; the other steps (load, reference, import, jit, run, check, compile) are only shown
# and recorded.

START_PHASE = "start"  # no heartbeat yet: a worker (or a cluster agent's kernel) just started
SANDBOX_PHASE = "sandbox"  # containment was required but not enforced (--require-sandbox)
BENCH_PHASE = "bench"  # --benchmark; a job timed alone waits here for `QuietGranted`
_PIPELINE_PHASE = "pipeline:"  # followed by the stage's name


def pipeline_phase(stage_name: str) -> str:
    """The phase of a pipeline stage (a pass or transform script), e.g. `pipeline:cse`."""
    return _PIPELINE_PHASE + stage_name


def is_pipeline_phase(phase: str) -> bool:
    return phase.startswith(_PIPELINE_PHASE)


# --- jobs -----------------------------------------------------------------------------------


class Stage(msgspec.Struct, frozen=True):
    """One pipeline stage: an MLIR pass pipeline element or a transform script.

    A transform stage carries its script's text, so a job needs no schedules folder to run.
    """

    kind: Literal["pass", "transform"]
    text: str  # "name{opt=v ...}" for a pass, the absolute .mlir path for a transform
    source: str  # the descriptor file (or command-line spec) this stage came from
    script: str = ""  # the transform script's text (transform stages only)

    @property
    def name(self) -> str:
        if self.kind == "pass":
            return self.text.split("{", 1)[0].strip()
        return self.text.rsplit("/", 1)[-1]

    @property
    def phase(self) -> str:
        """The phase a worker is in while it applies this stage."""
        return pipeline_phase(self.name)


class Scalar(msgspec.Struct, frozen=True, tag="scalar"):
    """A Python scalar input (KernelBench passes some as plain floats or ints)."""

    value: float | int | bool


class Tensor(msgspec.Struct, frozen=True, tag="tensor"):
    shape: Shape


Input = Scalar | Tensor


class Limits(msgspec.Struct, frozen=True):
    """Limits a worker applies to itself before any heavy work."""

    cores: tuple[int, ...] = ()
    mem_limit: int | None = None  # bytes of RLIMIT_DATA; None = unlimited
    # Containment (kbd/worker/contain.py): the worker may write only beneath `scratch` and
    # `writable`, and may not even read `hidden` (the results store); `sandbox=False` turns
    # filesystem and network containment off; with `require_sandbox` a missing mechanism is
    # the kernel's error instead of a note.
    scratch: str | None = None
    writable: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    sandbox: bool = True
    require_sandbox: bool = False


class ImportCache(msgspec.Struct, frozen=True):
    """The import cache's part of a job (the supervisor owns the cache; workers never write it).

    `module` is the cached MLIR of the imported, parameter-lifted model, already verified by the
    supervisor; None means the worker imports and sends the module back in an `Imported` frame.
    """

    key: str
    directory: str  # where the supervisor keeps entries (workers never touch it)
    max_bytes: int
    module: str | None = None


class Signature(msgspec.Struct, frozen=True):
    """How compiled code is called: its out-param and input buffers, each (dims, element type),
    and the inputs it writes (their new values are its first outputs, in this order)."""

    outputs: list[tuple[tuple[int, ...], str]]
    inputs: list[tuple[tuple[int, ...], str]]
    mutated: tuple[int, ...] = ()


class CompileCache(msgspec.Struct, frozen=True):
    """The compile cache's part of a job (kbd.caches.compile_cache; the supervisor owns the cache).

    `library` is a verified cached shared library that the supervisor copied into the worker's
    scratch folder, with its `signature`; None means the worker compiles and sends what it
    built back in a `Library` frame, when it can be cached.
    """

    key: str
    directory: str  # where the supervisor keeps entries (workers never touch it)
    max_bytes: int
    library: str | None = None
    signature: Signature | None = None


class BenchOptions(msgspec.Struct, frozen=True):
    """How to time a passing kernel (`--benchmark`): see kbd/worker/bench.py."""

    min_time_s: float = 1.0  # minimum measured time per side
    min_samples: int = 10  # minimum samples per side
    budget_s: float = 20.0  # stop sampling after this long, whatever was reached
    # Time alone: the worker waits at its bench phase until the supervisor has paused its other
    # workers (kbd/bench/quiet.py); False times while they run (--bench-concurrently).
    exclusive: bool = True
    # Separate worker processes the kernel is timed in (kbd/bench/processes.py); the minimum
    # time and samples and the budget above are the kernel's, shared out among them.
    processes: int = 3
    # Run and check the kernel once before timing it. A kernel's further processes skip that
    # (it passed in the first, with the same code); the check after timing validates each.
    check_first: bool = True
    # `--baseline inductor`: also time torch.compile(model) with its default backend (Inductor)
    # in the same alternation, as a second baseline beside eager.
    inductor: bool = False
    # Where Inductor keeps its caches for this kernel (kbd/caches/inductor_cache.py): a folder
    # shared by the kernel's processes, so that only the first compiles. None: the worker's
    # scratch folder.
    inductor_cache: str | None = None
    # Stop compiling Inductor after this long (`--inductor-timeout`; None: no limit): the
    # kernel is then timed against eager alone, `inductor_error` saying why, and its further
    # processes do not try again.
    inductor_limit_s: float | None = None

    def per_process(self, index: int) -> BenchOptions:
        """What the `processes` workers' number `index` (from 0) is asked to measure."""
        n = self.processes
        return BenchOptions(
            min_time_s=self.min_time_s / n,
            min_samples=max(1, -(-self.min_samples // n)),
            budget_s=self.budget_s / n,
            exclusive=self.exclusive,
            processes=1,
            check_first=index == 0,
            inductor=self.inductor,
            inductor_cache=self.inductor_cache,
            inductor_limit_s=self.inductor_limit_s,
        )


class Inspect(msgspec.Struct, frozen=True):
    """What a worker shows of its pipeline (`--print-*`, `--object-file`, `--dump-assembly`).

    Printed IR goes to the worker's stderr (the kernel's log), or, when `print_to` is set, into
    `IR_FILE` in its scratch folder, which the supervisor moves to `print_to` when the worker
    ends. Object files (`OBJECT_FILE`, one per compiled module) are moved next to the kernel's
    log, and disassembled there with `--dump-assembly`.
    """

    print_after_all: bool = False  # the module after every pass (and every transform script)
    print_original: bool = False  # the module given to the pipeline
    print_optimized: bool = False  # the module the pipeline produced (what the JIT compiles)
    print_to: str | None = None  # absolute file for this kernel's printed IR; None = its log
    object_file: bool = False  # write the JIT's machine code as an ELF object
    assembly: bool = False  # the supervisor disassembles the object files (--dump-assembly)

    @property
    def prints(self) -> bool:
        return self.print_after_all or self.print_original or self.print_optimized


IR_FILE = "kbd-ir.mlir"  # in a worker's scratch folder: printed IR when `Inspect.print_to` is set
OBJECT_FILE = "kbd-object-{index}.o"  # in a worker's scratch folder: compiled module `index`
STAGE_SNAPSHOT = "kbd-stage.msgpack"  # in a worker's scratch folder: a `StageSnapshot`
STAGE_INPUT = "kbd-stage-input.mlir"  # in a worker's scratch folder: a failed stage's input


class StageSnapshot(msgspec.Struct, frozen=True):
    """The IR before the pipeline stage a worker is running, with that stage.

    The worker replaces `STAGE_SNAPSHOT` in its scratch folder (atomically) as each stage
    starts, so that whatever ends the stage (a failing pass, a segfault, a timeout) the
    supervisor can write a reproducer bundle (kbd/engine/bundles.py). The module is bytecode,
    which is cheaper to write than text; when a stage fails without killing the worker, the
    worker also writes its input as text (`STAGE_INPUT`).
    """

    index: int  # 0-based position of the stage in the pipeline
    stages: int  # stages in the pipeline
    stage: Stage
    module: bytes  # MLIR bytecode
    subgraph: int | None = None  # compile mode: which captured graph (0-based)


# What a record's pipeline says when the worker chose it from `Job.families`.
FOUND_AT_RUN_TIME = "family found at run time"


class FamilyPipeline(msgspec.Struct, frozen=True):
    """One schedule family's pipeline, for a worker that finds its kernel's family itself."""

    name: str  # as `Job.pipeline`: the descriptor, relative to schedules/
    stages: list[Stage]


# Where a kernel's inputs and init args come from (`--shapes`): its levels entry, or
# "kernelbench", its problem file's own get_inputs() and get_init_inputs() as they are.
ShapesFrom = Literal["levels", "kernelbench"]


class Sized(msgspec.Struct, frozen=True, tag="sized"):
    """A problem's own inputs and what one forward at them costs, measured without making them
    (on torch's meta device, kbd/worker/sizing.py): the answer to `Size`."""

    # Each item of get_inputs(): a tensor as DIMSxTYPE (e.g. 16x16384xf32, in the job's element
    # type), anything else as its repr (e.g. 2.5); and the bytes of each (0 for a non-tensor).
    inputs: list[str]
    input_bytes: list[int]
    output_bytes: int | None  # one forward's outputs; None: the forward did not run on meta
    param_bytes: int  # the model's parameters and buffers
    flops: int | None  # one forward, counted as `kbd levels generate` counts; None: unknown
    note: str = ""  # where the measure could not stay on the meta device, why


class Job(msgspec.Struct, frozen=True, tag="job"):
    """Everything a worker needs to run one kernel."""

    kernel: str  # e.g. "level1/2_Standard_matrix_multiplication_.py"
    source: str  # absolute path of the KernelBench problem file (names it in tracebacks)
    source_text: str  # the problem file's text: the worker runs this, not the file
    inputs: list[Input] | None  # None: use the problem's get_inputs()
    init_args: Any  # list of constructor args, or None for get_init_inputs()
    outputs: list[Shape] | None  # expected output shapes, checked against the import
    dtype: str
    stages: list[Stage]
    seed: int
    tolerance: float
    max_tolerance: float
    opt_level: int
    limits: Limits
    import_cache: ImportCache | None = None  # None: import without the cache
    bench: BenchOptions | None = None  # time the kernel after it passes
    mode: Mode = "import"
    inspect: Inspect = Inspect()  # IR printing and object files
    compile_cache: CompileCache | None = None  # None: compile without the cache
    pipeline: str = ""  # what the stages are, for the record (kbd.plan.pipelines.Chosen.name)
    # A levels entry naming no family: the pipeline of each family that has a schedule for the
    # target. The worker finds the kernel's family in its exported graph (as `kbd levels
    # generate` does), runs that family's pipeline instead of `stages` and says which
    # (`PipelineChosen`); a family without one here, or none, keeps `stages`.
    families: dict[str, FamilyPipeline] = {}
    # "kernelbench": inputs, init_args and outputs are None (the problem's own), and the
    # supervisor sizes the kernel in a `Size` task before it admits the job; `sized` is that
    # measure, which the worker checks get_inputs() against (the caches key on its shapes).
    shapes: ShapesFrom = "levels"
    sized: Sized | None = None
    # Planning (the worker ignores it): the JIT's -O once sizing finds a forward of at least
    # kbd.plan.spec.SMOKE_HEAVY_GFLOPS, when that changes it (--smoke-test's scalar path).
    heavy_opt_level: int | None = None

    @property
    def timed_alone(self) -> bool:
        """Benchmarked with the other workers paused (kbd/bench/quiet.py)."""
        return self.bench is not None and self.bench.exclusive


class Budget(msgspec.Struct, frozen=True):
    """What one kernel may cost at the shapes a levels file gives it."""

    nbytes: int  # inputs + outputs + parameters and buffers
    flops: float  # one forward


class Generate(msgspec.Struct, frozen=True, tag="generate"):
    """Measure one problem for a levels file (`kbd levels generate`): shapes within `budget`."""

    kernel: str  # e.g. "level1/2_Standard_matrix_multiplication_.py"
    source: str  # absolute path of the problem file (names it in tracebacks)
    source_text: str  # the problem file's text: the worker measures this, not the file
    budget: Budget
    limits: Limits
    # Hand-given in overrides.yaml: measure at these instead of searching (None: not given).
    input_shapes: list[str | int | float] | None = None
    init_args: list[Any] | None = None


class Size(msgspec.Struct, frozen=True, tag="size"):
    """Measure a problem at its own shapes without making its inputs (`--shapes kernelbench`):
    its get_init_inputs(), Model and get_inputs() on the meta device and one forward there;
    answered by `Sized`."""

    kernel: str  # e.g. "level1/19_ReLU.py"
    source: str  # absolute path of the problem file (names it in tracebacks)
    source_text: str  # the problem file's text: the worker measures this, not the file
    dtype: str  # the element type the job runs in (floating inputs and the model cast to it)
    seed: int
    limits: Limits


class Replay(msgspec.Struct, frozen=True, tag="replay"):
    """Run one pipeline stage on a module (`kbd replay BUNDLE`): no kernel, no reference."""

    kernel: str  # the kernel the bundle came from (names the worker)
    module: bytes  # the IR before the stage: MLIR text (UTF-8) or bytecode
    stage: Stage  # a transform stage carries its script's text
    limits: Limits


Task = Job | Size | Generate | Replay


# --- worker -> supervisor -------------------------------------------------------------------


class Phase(msgspec.Struct, frozen=True, tag="phase"):
    """Heartbeat sent before each step: load, reference, import, pipeline:<stage>, jit, run,
    check, bench (see the phase names above)."""

    name: str


class BenchSamples(msgspec.Struct, frozen=True):
    """Raw timings of one kernel, compiled and eager, measured alternately in the same worker.

    Each sample is a batch of `*_batch` back-to-back calls; values are nanoseconds per call.
    Sample i of each side was taken next to sample i of the other (they pair up).
    `loop` says how the compiled side was timed: "jit" (import mode), a loop inside the JIT code
    around direct calls of the compiled function; "python" (compile mode), a Python loop calling
    the whole compiled forward (Dynamo's guards, compiled subgraphs, the eager remainder), timed
    exactly as eager is.
    """

    compiled_ns: list[float]
    eager_ns: list[float]
    compiled_batch: int
    eager_batch: int
    # Per call, the calling path measured on an empty function: the JIT loop calling an empty
    # function ("jit"), or the Python loop calling an empty Python function ("python"; then it
    # is part of both sides' times).
    overhead_ns: float
    threads: int  # torch threads for eager (compiled code is single-threaded unless OpenMP)
    budget_hit: bool  # stopped by the time budget before the minimum time and samples
    loop: BenchLoop = "jit"
    # With `BenchOptions.inductor`: torch.compile(model) (Inductor) timed with eager's Python
    # loop, sample i taken right after sample i of the other two sides. Its first call, which
    # compiles (Dynamo, Inductor, the C++ compiler), is timed apart and never sampled. Empty
    # samples and `inductor_error` set when Inductor could not compile or run the kernel.
    inductor_ns: list[float] = []
    inductor_batch: int = 0
    inductor_compile_s: float | None = None
    # Whether that first call loaded every graph from Inductor's caches instead of compiling it
    # (`BenchOptions.inductor_cache`): its time is then mostly Dynamo's tracing and a load.
    inductor_cached: bool = False
    inductor_error: str | None = None


class Coverage(msgspec.Struct, frozen=True):
    """Compile mode: what went through MLIR and what Dynamo left to eager, for one forward."""

    subgraphs: int  # graphs Dynamo handed to kbd's backend, each compiled through MLIR
    graph_ops: int  # FX operations inside those graphs
    graph_breaks: int  # times Dynamo stopped tracing (graph breaks and skipped frames)
    break_reasons: list[str] = []  # first line of each distinct reason
    eager_ops: dict[str, int] = {}  # aten ops that ran outside compiled graphs, by name
    # False: the kernel failed before its checked forward finished; the counts are what was
    # compiled until then, and eager_ops was not measured.
    finished: bool = True


class Result(msgspec.Struct, frozen=True, tag="result"):
    """How the kernel ended, as the worker saw it."""

    outcome: Outcome
    phase: str
    message: str = ""
    # The smallest tolerance of the form requested * 10**k, up to max_tolerance, that passes.
    passing_tolerance: float | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    times: dict[str, float] = {}  # seconds per phase
    limits_enforced: dict[str, str] = {}
    bench: BenchSamples | None = None  # with --benchmark, for a kernel that passed
    coverage: Coverage | None = None  # compile mode only
    random_inputs: int = 0  # random ops in forward replaced by tensors drawn by eager
    state_writes: list[str] = []  # buffers and inputs forward wrote, carried out
    compile_cache: str | None = None  # "hit", "miss", or "not cached: <why>"; None: not used


class PipelineChosen(msgspec.Struct, frozen=True, tag="pipeline"):
    """The pipeline a worker chose from `Job.families`, sent before it runs it, so that the
    record names it even when the pipeline kills the worker."""

    name: str


class Imported(msgspec.Struct, frozen=True, tag="imported"):
    """A freshly imported module, for the supervisor to store in the import cache."""

    key: str
    module: str


class Generated(msgspec.Struct, frozen=True, tag="generated"):
    """A problem measured at the shapes chosen for its levels entry (answer to `Generate`)."""

    input_shapes: list[str | int | float]  # levels-file shape strings, or numbers for scalars
    initializations: list[str]
    outputs: list[tuple[int, ...]]  # () for a 0-d output
    init_args: list[Any]
    flops: int
    nbytes: int
    original_flops: int  # at KernelBench's own shapes
    original_nbytes: int
    reductions: list[tuple[str, Any, Any]] = []  # (knob, KernelBench's value, chosen value)
    fits: bool = True  # within the budget
    # Entry fields from further measurement steps (kbd.worker.generate.FIELD_STEPS).
    fields: dict[str, Any] = {}


class Library(msgspec.Struct, frozen=True, tag="library"):
    """A freshly compiled kernel as a shared library, for the supervisor's compile cache."""

    key: str
    data: bytes
    signature: Signature


WorkerMessage = Phase | Result | Imported | Library | Generated | Sized | PipelineChosen


# --- supervisor -> worker, after its task ---------------------------------------------------


class QuietGranted(msgspec.Struct, frozen=True, tag="quiet"):
    """Supervisor to worker, after the task: the other workers are paused, time now (the answer
    to the `BENCH_PHASE` heartbeat of a job with `BenchOptions.exclusive`; kbd/bench/quiet.py)."""


# --- supervisor <-> template ----------------------------------------------------------------


class Spawn(msgspec.Struct, frozen=True, tag="spawn"):
    """Fork a worker; its socket end is attached to this frame as SCM_RIGHTS."""

    token: int


class Spawned(msgspec.Struct, frozen=True, tag="spawned"):
    token: int
    pid: int


class Exited(msgspec.Struct, frozen=True, tag="exited"):
    """A worker was reaped: its raw wait status and its peak RSS from wait4."""

    pid: int
    returncode: int  # negative: killed by that signal
    peak_rss_bytes: int


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    """The template has imported everything and accepts Spawn frames."""


TemplateMessage = Spawned | Exited | Ready

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def encode(message: msgspec.Struct) -> bytes:
    """One frame: length prefix plus msgpack payload."""
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(payload)) + payload


def decode(payload: bytes, kind: Any) -> Any:
    """Decode a frame payload as `kind` (a Struct type or a union of them)."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from None


def frame_length(header: bytes, limit: int = MAX_FRAME) -> int:
    """Length of the payload announced by a 4-byte header; rejects frames over `limit`."""
    (length,) = _HEADER.unpack(header)
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes announced, limit is {limit}")
    return length


async def receive(stream: Any, kind: Any, limit: int = MAX_FRAME) -> Any:
    """Read one frame from an anyio BufferedByteReceiveStream.

    A stream that ends before or inside a frame raises anyio.IncompleteRead.
    """
    length = frame_length(await stream.receive_exactly(_HEADER.size), limit)
    return decode(await stream.receive_exactly(length), kind)


def send_blocking(sock: socket.socket, message: msgspec.Struct) -> None:
    """Write one frame on a blocking socket (worker side)."""
    sock.sendall(encode(message))


def receive_blocking(sock: socket.socket, kind: Any) -> Any:
    """Read one frame from a blocking socket; raises EOFError when the peer is gone."""
    length = frame_length(_read_exactly(sock, _HEADER.size))
    return decode(_read_exactly(sock, length), kind)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise EOFError("peer closed the connection")
        chunks += chunk
    return bytes(chunks)
