"""What to run: one typed specification of a `kbd run` or `kbd sweep`.

`SweepSpec` is built and validated once, at the edge (`from_args`), and is plain data from then
on: the planner reads it, the store keeps it JSON-encoded with the sweep so that `--resume` runs
with exactly the original options, and a daemon or cluster backend can ship it as it is.
Paths in it are absolute, so it means the same from any working directory. How results are
shown (`--json`, `--junit`, `--log-dir`) is not part of it: that belongs to each invocation.
"""

from __future__ import annotations

import hashlib
import math
import re
from argparse import Namespace
from pathlib import Path
from typing import Literal

import msgspec

from kbd.plan import limits
from kbd.shared.errors import InputError
from kbd.shared.protocol import BenchOptions

DEFAULT_MEM_LIMIT = "4GiB"
# With --benchmark a worker holds more than the run does: each side's outputs and eager's
# temporaries, kept by the timing's steady allocator (kbd/worker/bench.py). A bench-tier kernel
# (up to 1 GiB of buffers, README "Levels") with Inductor beside it peaked at up to 4.9 GiB.
DEFAULT_BENCH_MEM_LIMIT = "8GiB"
# --smoke-test checks correctness: LLVM -O0 JITs ~50x faster than -O3 on a 13-kernel sample with
# the same outcomes and tolerances (scripts/bench-smoke-jit; README "Sweeps").
SMOKE_OPT_LEVEL = 0
DEFAULT_OPT_LEVEL = 3
# Without --benchmark nothing is timed: the JIT runs LLVM at -O2, whose loop passes cost far less
# on the small static trip counts of family schedules (a ReLU on 16x1024: 0.04 s against 0.09-0.64
# s at -O3). Benchmarks keep -O3, so the code timed is fully optimised (scripts/bench-ops found
# -O2 code within about 12% of it on seven ops, faster on some, slower on others).
CHECK_OPT_LEVEL = 2
# ...except kernels this heavy (GFLOP per forward, from the levels entry), which no smoke shape
# brings under the catalog's budget: their scalar loops run for minutes at -O0 (VGG16 and VGG19
# at 31 and 39 GFLOP), far longer than -O3 takes to JIT them.
SMOKE_HEAVY_GFLOPS = 20.0
LOCAL = "local"  # `--cluster local`: run on this machine (e.g. to resume a cluster sweep here)
# Element types a whole run may be cast to (`--dtype`); a levels entry may name others (f64).
DTYPES = ("f32", "bf16", "f16")
# The least tolerance a kernel in a low-precision type is checked with, whatever --tolerance
# says: eager in that type is itself that far from eager in f32 on most kernels. Measured by
# scripts/dtype-tolerance over the smoke catalog (README, "Element types").
TOLERANCE_FLOOR = {"bf16": 0.05, "f16": 0.01}
_TARGET_NAME = re.compile(r"[A-Za-z0-9_.]+")


def is_heavy(gflops: float | None) -> bool:
    """A kernel that gets -O3 even on --smoke-test's scalar path (SMOKE_HEAVY_GFLOPS)."""
    return gflops is not None and gflops >= SMOKE_HEAVY_GFLOPS


class Shard(msgspec.Struct, frozen=True):
    """Shard `index` of `count` (1-based): a stable subset of kernels, by hash of the name."""

    index: int
    count: int

    def contains(self, kernel: str) -> bool:
        bucket = int(hashlib.sha256(kernel.encode()).hexdigest(), 16) % self.count
        return bucket == self.index - 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


class TuneDefaults(msgspec.Struct, frozen=True):
    """`kbd tune`'s own option defaults (kbd.tune.session.TuneSpec carries the values)."""

    budget: int = 50  # configurations measured per kernel
    search_time_s: float = 0.3  # minimum seconds per side of a candidate while searching


class SweepSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Which kernels to run, how to compile and check them, and under which limits."""

    # selection
    kernels: tuple[str, ...] = ()  # path prefixes, e.g. "level1/"; empty = every entry
    levels: tuple[str, ...] = ()  # absolute levels-file paths; empty = the whole catalog
    # which catalog: levels/ or levels/bench/; "kernelbench" selects from levels/ (or --levels)
    # and runs each kernel with its problem's own get_inputs() and get_init_inputs()
    shapes: Literal["smoke", "bench", "kernelbench"] = "smoke"
    kernelbench: str | None = None  # absolute KernelBench root; None = $KBD_KERNELBENCH/default
    shard: Shard | None = None
    # compilation and checking
    pipeline: tuple[str, ...] = ()  # --pipeline specs replacing the entries' pipelines
    smoke_test: bool = False  # every kernel through the default scalar pipeline
    # --schedules: "family" (each kernel's family schedule via the finder, kbd.plan.pipelines) or
    # "scalar" (the default pipeline); None = family, or scalar with --smoke-test
    schedules: Literal["family", "scalar"] | None = None
    cwd: str = "."  # where relative --pipeline files are looked up
    target: str | None = None  # --target: the finder's architecture; None = this machine's
    features: tuple[str, ...] | None = None  # --feature: the finder's features; None = host's
    tuned: bool = True  # apply tuned configurations on an exact key match (off: --untuned)
    seed: int = 0
    tolerance: float = 0.01  # rtol = atol required to pass (at least TOLERANCE_FLOOR[dtype])
    max_tolerance: float = 1.0  # largest tolerance tried when reporting a mismatch
    opt_level: int | None = None  # the JIT's LLVM -O as given; None: per kernel (opt_level_for)
    import_cache: bool = True  # reuse imported MLIR from <cwd>/.kbd/import-cache
    compile_cache: bool = True  # reuse compiled libraries from <cwd>/.kbd/compile-cache
    # import: torch.export of the whole forward; compile: torch.compile with kbd's Dynamo
    # backend; both: each kernel both ways (two records, keyed by kernel and mode)
    mode: Literal["import", "compile", "both"] = "import"
    # --dtype: the element type of every kernel (its model, floating inputs and outputs),
    # replacing its levels entry's; None = each entry's own (f32 unless it names one)
    dtype: str | None = None
    # workers and limits
    jobs: int | None = None  # parallel workers; None = one per usable core
    timeout: float = 600.0  # seconds per kernel
    mem_limit: int | None = limits.parse_size(DEFAULT_MEM_LIMIT, "--mem-limit")  # None = no cap
    mem_budget: int | None = None  # bytes for all workers together; None = decided at start
    # containment (kbd/worker/contain.py)
    sandbox: bool = True  # False: no filesystem or network containment (--no-sandbox)
    require_sandbox: bool = False  # a mechanism missing on this machine fails the kernel
    # benchmarking
    bench: BenchOptions | None = None  # --benchmark: time passing kernels against eager
    # seeing inside the pipeline (kbd/engine/dumps.py): IR into each kernel's log, or under print_to
    print_mlir_after_all: bool = False
    print_original_module: bool = False
    print_optimized_module: bool = False
    print_to: str | None = None  # absolute file or folder (a folder ends with '/' or exists)
    object_file: bool = False  # <log name>.o next to each kernel's log
    dump_assembly: bool = False  # <log name>.s (and .o) next to each kernel's log
    # where: a Ray cluster address ("auto", "HOST:PORT", "ray://..."), or None for this machine.
    # On a cluster, `jobs` and `mem_budget` apply per node (see kbd.cluster).
    cluster: str | None = None

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes each kernel runs in: one record per kernel and mode."""
        return ("import", "compile") if self.mode == "both" else (self.mode,)

    @property
    def family_schedules(self) -> bool:
        """Do kernels run their family schedules (kbd.plan.pipelines)?"""
        return self.schedules == "family" if self.schedules else not self.smoke_test

    def tolerance_for(self, dtype: str) -> float:
        """The tolerance a kernel of element type `dtype` is checked with: --tolerance, raised
        to the type's floor (TOLERANCE_FLOOR); the same rule for every kernel."""
        return max(self.tolerance, TOLERANCE_FLOOR.get(dtype, 0.0))

    def opt_level_for(self, gflops: float | None) -> int:
        """The JIT's -O for a kernel of `gflops` GFLOP per forward: -O as given; else -O3 with
        --benchmark; else -O0 on the --smoke-test scalar path, except -O3 for kernels of at
        least SMOKE_HEAVY_GFLOPS; else -O2 (family schedules are written for optimised code: at
        -O0, 46 of 53 smoke kernels crashed with SIGSEGV)."""
        if self.opt_level is not None:
            return self.opt_level
        if self.bench is not None:
            return DEFAULT_OPT_LEVEL
        if self.smoke_test and not self.family_schedules:
            return DEFAULT_OPT_LEVEL if is_heavy(gflops) else SMOKE_OPT_LEVEL
        return CHECK_OPT_LEVEL

    def heavy_opt_level(self) -> int | None:
        """For a kernel whose FLOPs are known only once it is sized (`--shapes kernelbench`):
        its -O if sizing finds it heavy (`is_heavy`), when that differs from its -O otherwise;
        the supervisor applies it (kbd.engine.scheduler.sized)."""
        heavy = self.opt_level_for(math.inf)
        return heavy if heavy != self.opt_level_for(None) else None

    def __post_init__(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise InputError(f"-j/--jobs must be at least 1, got {self.jobs}")
        if not self.timeout > 0:  # also NaN
            raise InputError(f"--timeout must be positive, got {self.timeout:g}")
        if not 0 < self.tolerance <= self.max_tolerance < math.inf:  # also NaN
            raise InputError(
                "--tolerance must be positive and at most --max-tolerance, which must be finite "
                f"(got {self.tolerance:g} and {self.max_tolerance:g})"
            )
        if not 0 <= self.seed < 2**32:  # numpy's range
            raise InputError(f"--seed must be between 0 and {2**32 - 1}, got {self.seed}")
        if self.require_sandbox and not self.sandbox:
            raise InputError("--require-sandbox and --no-sandbox contradict each other")
        if self.mem_limit is not None and self.mem_limit < limits.MIN_MEM_LIMIT:
            raise InputError(
                f"--mem-limit {limits.format_size(self.mem_limit)} is below the "
                f"{limits.format_size(limits.MIN_MEM_LIMIT)} a worker needs before it runs "
                "anything (torch and torch-mlir are loaded); use 'none' for no cap"
            )
        for name in (self.target, *(self.features or ())):
            if name is not None and not _TARGET_NAME.fullmatch(name):
                raise InputError(
                    f"--target/--feature {name!r}: expected a name like x86_64 or avx2"
                )
        if self.shard is not None and not 1 <= self.shard.index <= self.shard.count:
            raise InputError(f"--shard {self.shard}: I must be between 1 and N")
        if self.bench is not None:
            if not self.bench.min_time_s >= 0:  # also NaN
                raise InputError(
                    f"--bench-time must not be negative, got {self.bench.min_time_s:g}"
                )
            if self.bench.min_samples < 1:
                raise InputError(
                    f"--bench-samples must be at least 1, got {self.bench.min_samples}"
                )
            if not self.bench.budget_s > 0:
                raise InputError(f"--bench-budget must be positive, got {self.bench.budget_s:g}")
            if self.bench.processes < 1:
                raise InputError(
                    f"--bench-processes must be at least 1, got {self.bench.processes}"
                )
        prints = self.print_mlir_after_all or self.print_original_module
        if self.print_to is not None and not (prints or self.print_optimized_module):
            raise InputError(
                "--print-to needs --print-mlir-after-all, --print-original-module or "
                "--print-optimized-module"
            )
        if self.cluster is not None and (not self.cluster.strip() or " " in self.cluster):
            raise InputError(f"--cluster {self.cluster!r}: expected auto, HOST:PORT or ray://...")


def from_args(args: Namespace, cwd: Path) -> SweepSpec:
    """The spec of a `kbd run` or `kbd sweep` command line; raises InputError on bad options."""
    return SweepSpec(
        kernels=tuple(args.kernels),
        levels=tuple(str((cwd / f).resolve()) for f in args.levels),
        kernelbench=str((cwd / args.kernelbench).resolve()) if args.kernelbench else None,
        shard=parse_shard(args.shard) if args.shard else None,
        pipeline=tuple(args.pipeline),
        smoke_test=args.smoke_test,
        schedules=args.schedules,
        tuned=not args.untuned,
        target=args.target,
        features=tuple(args.feature) if args.feature is not None else None,
        cwd=str(cwd),
        seed=args.seed,
        tolerance=args.tolerance,
        max_tolerance=args.max_tolerance,
        opt_level=args.opt_level,
        import_cache=not args.no_import_cache,
        compile_cache=not args.no_compile_cache,
        mode=args.mode,
        dtype=args.dtype,
        jobs=args.jobs,
        timeout=args.timeout,
        mem_limit=_mem_limit(args),
        mem_budget=limits.parse_size(args.mem_budget, "--mem-budget") if args.mem_budget else None,
        sandbox=not args.no_sandbox,
        require_sandbox=args.require_sandbox,
        shapes=args.shapes,
        bench=_bench_options(args),
        cluster=parse_cluster(args.cluster),
        print_mlir_after_all=args.print_mlir_after_all,
        print_original_module=args.print_original_module,
        print_optimized_module=args.print_optimized_module,
        print_to=_print_to(args.print_to, cwd),
        object_file=args.object_file,
        dump_assembly=args.dump_assembly,
    )


def _print_to(text: str | None, cwd: Path) -> str | None:
    """--print-to as an absolute path, keeping a trailing '/' (it says: a folder)."""
    if text is None:
        return None
    if not text.strip():
        raise InputError("--print-to: empty path")
    path = str((cwd / text).resolve())
    return path + "/" if text.endswith("/") else path


def _bench_options(args: Namespace) -> BenchOptions | None:
    baselines = set(args.baseline or ())
    limit = args.inductor_timeout
    if limit is not None and "inductor" not in baselines:
        raise InputError("--inductor-timeout needs --baseline inductor: it limits that compile")
    if not args.benchmark:
        if baselines:
            raise InputError("--baseline needs --benchmark: baselines are what timing compares")
        return None
    if limit is not None and not limit > 0:  # also NaN
        raise InputError(f"--inductor-timeout must be positive, got {limit:g}")
    return BenchOptions(
        min_time_s=args.bench_time,
        min_samples=args.bench_samples,
        budget_s=args.bench_budget,
        exclusive=not args.bench_concurrently,
        processes=args.bench_processes,
        inductor="inductor" in baselines,
        inductor_limit_s=limit if limit is not None else args.timeout / 2,
    )


def parse_shard(text: str) -> Shard:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise InputError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= index <= count:
        raise InputError(f"--shard {text!r}: I must be between 1 and N")
    return Shard(index, count)


class TuneSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What `kbd tune` does (kbd.tune.session): the sweep options of its candidates, and how to
    search. Stored with its session, to resume; shipped to a daemon as it is."""

    sweep: SweepSpec  # selection, compilation, limits; `bench` is the confirmation protocol
    descriptor: str | None = None  # --pipeline: the tunable descriptor (None: the finder's)
    budget: int = TuneDefaults().budget  # measurements per kernel
    search_time_s: float = TuneDefaults().search_time_s  # per side and candidate, searching
    seed: int = 0


def parse_cluster(text: str | None) -> str | None:
    """`--cluster ADDRESS|auto|local`: local (or no option) means this machine."""
    return None if text is None or text == LOCAL else text


def encode(spec: SweepSpec) -> str:
    """JSON text of a spec, as the store keeps it."""
    return msgspec.json.encode(spec).decode()


def decode(text: str, where: str) -> SweepSpec:
    """A stored spec; `where` names its origin (e.g. the sweep) in the error message."""
    try:
        return msgspec.json.decode(text, type=SweepSpec)
    except msgspec.ValidationError as exc:
        raise InputError(f"{where}: stored options are not valid ({exc})") from None
    except msgspec.DecodeError:
        raise InputError(f"{where}: stored options are not JSON") from None


def _mem_limit(args) -> int | None:
    """--mem-limit as given, or its default: larger with --benchmark (DEFAULT_BENCH_MEM_LIMIT)."""
    if args.mem_limit is not None:
        return _optional_size(args.mem_limit, "--mem-limit")
    default = DEFAULT_BENCH_MEM_LIMIT if getattr(args, "benchmark", False) else DEFAULT_MEM_LIMIT
    return limits.parse_size(default, "--mem-limit")


def _optional_size(text: str, option: str) -> int | None:
    return None if str(text).lower() == "none" else limits.parse_size(text, option)
