"""`kbd doctor`: which enforcement works on this machine, each tried in a real worker.

The doctor starts the warm template the way a sweep does, with a results store open, and runs
the probe kernel (kbd/worker/probe_kernel.py) once per check through the ordinary runner. Each
check reads what the worker found from inside, plus what the worker reported in its limits,
and says `works` or `NOT ENFORCED` with the reason. Supervisor side: no torch.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import anyio
import psutil

from kbd.engine.runner import run_kernel
from kbd.engine.scratch import store_files
from kbd.engine.spawner import Spawner, template_env
from kbd.plan import catalog, limits
from kbd.plan.catalog import Entry
from kbd.plan.invocation import DEFAULT_DB
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared.containment import NOT_ENFORCED
from kbd.shared.protocol import Job, Limits, Tensor
from kbd.shared.shapes import parse_shape

PROBE_SOURCE = Path(__file__).resolve().parent.parent / "worker" / "probe_kernel.py"
PREFIX = "kbd-probe "  # = probe_kernel.PREFIX (that module imports torch)
TARGETS_ENV = "KBD_PROBE_TARGETS"
STORE_ENV = "KBD_PROBE_STORE"
MARKER = "86400.456"
PROBE_MEM_LIMIT = 2 << 30  # the probe allocates 4 GiB
PROBE_TIMEOUT_S = 1.0
CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Check:
    name: str
    works: bool
    detail: str


def doctor(args: Namespace) -> int:
    """Print every enforcement and whether it works; with --strict, exit 1 if one does not."""
    print(f"kbd doctor: {machine_line()}")
    checks = anyio.run(run_checks)
    width = max(len(c.name) for c in checks)
    for check in checks:
        state = "works" if check.works else "NOT ENFORCED"
        print(f"  {check.name:<{width}}  {state:<12}  {check.detail}")
    failing = [c.name for c in checks if not c.works]
    if failing:
        print(f"kbd doctor: not enforced here: {', '.join(failing)}", file=sys.stderr)
        return 1 if args.strict else 0
    return 0


def machine_line() -> str:
    uname = platform.uname()
    cgroup = "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1"
    return (
        f"Linux {uname.release} {uname.machine}, {_cpu_model()}, "
        f"uid {os.geteuid()}, cgroup {cgroup}"
    )


async def run_checks() -> list[Check]:
    with tempfile.TemporaryDirectory(prefix="kbd-doctor-") as tmp:
        work = Path(tmp)
        store = Store(work / DEFAULT_DB)  # held open, as during a sweep
        targets = [Path.home(), work / ".kbd", catalog.REPO_ROOT, Path.cwd()]
        env = template_env(
            1,
            **{
                TARGETS_ENV: os.pathsep.join(str(t) for t in dict.fromkeys(targets)),
                STORE_ENV: str(store.path),
            },
        )
        try:
            async with Spawner.started(env, work / "logs" / "template.log") as spawner:
                core = limits.usable_cores()[-1]

                hidden = store_files(store.path)

                async def probe(check: str, **options) -> Record:
                    return await _probe(spawner, work, check, core=core, hidden=hidden, **options)

                return [
                    _memory(await probe("memory", mem_limit=PROBE_MEM_LIMIT)),
                    _cores(await probe("cores"), core),
                    _timeout(await probe("timeout", timeout=PROBE_TIMEOUT_S)),
                    _filesystem(await probe("filesystem"), store.path),
                    _network(await probe("network")),
                    _descriptors(await probe("descriptors")),
                    await _cleanup(await probe("cleanup")),
                ]
        finally:
            store.close()


async def _probe(
    spawner: Spawner,
    work: Path,
    check: str,
    *,
    core: int,
    hidden: tuple[str, ...],
    mem_limit: int | None = None,
    timeout: float = CHECK_TIMEOUT_S,
) -> Record:
    entry = Entry(
        kernel=f"doctor/{check}.py",
        levels_file="(kbd doctor)",
        inputs=[Tensor(parse_shape("1", "kbd doctor"))],
        outputs=None,
        init_args=[check],
        gflops=None,
        pipeline=None,
        dtype="f32",
        xfail=None,
    )
    job = Job(
        kernel=entry.kernel,
        source=str(PROBE_SOURCE),
        source_text=PROBE_SOURCE.read_text(),
        inputs=entry.inputs,
        init_args=entry.init_args,
        outputs=None,
        dtype="f32",
        stages=[],
        seed=0,
        tolerance=0.01,
        max_tolerance=1.0,
        opt_level=0,
        limits=Limits(cores=(core,), mem_limit=mem_limit, hidden=hidden),
    )
    return await run_kernel(
        spawner, entry, job, timeout=timeout, log_path=work / "logs" / f"{check}.log"
    )


def _findings(record: Record) -> dict | None:
    """What the probe reported from inside the worker, or None if it did not get that far."""
    marker = record.message.find(PREFIX)
    if record.outcome != "error" or marker < 0:
        return None
    return json.loads(record.message[marker + len(PREFIX) :])


def _unexpected(name: str, record: Record) -> Check:
    return Check(
        name, False, f"probe ended {record.outcome} in {record.phase}: {record.message[:200]}"
    )


def _memory(record: Record) -> Check:
    name = "memory cap"
    if record.outcome == "memory":
        return Check(
            name, True, f"{record.limits.get('memory')}: a 4 GiB allocation failed in the worker"
        )
    found = _findings(record)
    if found is not None:
        return Check(name, False, f"a 4 GiB allocation succeeded under a {PROBE_MEM_LIMIT} cap")
    return _unexpected(name, record)


def _cores(record: Record, core: int) -> Check:
    name = "core pinning"
    found = _findings(record)
    if found is None:
        return _unexpected(name, record)
    ok = found["affinity"] == [core] and found["threads"] == 1
    detail = (
        f"asked for core {core}: worker affinity {found['affinity']}, "
        f"{found['threads']} torch thread(s), OMP_NUM_THREADS={found['OMP_NUM_THREADS']}"
    )
    return Check(name, ok, detail)


def _timeout(record: Record) -> Check:
    name = "timeout"
    if record.outcome == "timeout":
        return Check(name, True, f"a hanging kernel was killed; ended after {record.wall_s:.1f} s")
    return _unexpected(name, record)


def _filesystem(record: Record, store: Path) -> Check:
    name = "filesystem"
    enforced = record.limits.get("filesystem", "not reported")
    found = _findings(record)
    if found is None:
        return _unexpected(name, record)
    if found["written"]:
        reason = enforced.removeprefix(NOT_ENFORCED)
        return Check(name, False, f"{reason}; a kernel wrote into {', '.join(found['written'])}")
    if not found["scratch"].startswith("writable"):
        return Check(name, False, f"{enforced}; but scratch is {found['scratch']}")
    if found["store"] == "ok":
        return Check(name, False, f"{enforced}; but a kernel could read the store {store}")
    denied = ", ".join(found["denied"])
    return Check(
        name,
        True,
        f"{enforced}; denied writing {denied}; reading the store: {found['store']}; "
        "scratch writable",
    )


def _network(record: Record) -> Check:
    name = "network"
    enforced = record.limits.get("network", "not reported")
    found = _findings(record)
    if found is None:
        return _unexpected(name, record)
    allowed = [what for what, result in found.items() if result == "ok"]
    if allowed:
        reason = enforced.removeprefix(NOT_ENFORCED)
        return Check(name, False, f"{reason}; a kernel could: {', '.join(allowed)}")
    blocked = "; ".join(f"{what}: {result}" for what, result in found.items())
    return Check(name, True, f"{enforced}; {blocked}")


def _descriptors(record: Record) -> Check:
    name = "descriptors"
    found = _findings(record)
    if found is None:
        return _unexpected(name, record)
    extra = {
        fd: target
        for fd, target in found["fds"].items()
        if int(fd) > 2 and not target.startswith("socket:")
    }
    sockets = sum(1 for fd, t in found["fds"].items() if int(fd) > 2 and t.startswith("socket:"))
    if extra or sockets != 1:
        return Check(name, False, f"worker holds more than its channel: {found['fds']}")
    return Check(name, True, "worker holds only stdin/stdout/stderr and its channel (no store)")


async def _cleanup(record: Record) -> Check:
    name = "process cleanup"
    found = _findings(record)
    if found is None:
        return _unexpected(name, record)
    survivors = list(found["pids"])
    deadline = time.monotonic() + 5
    while survivors and time.monotonic() < deadline:
        survivors = [pid for pid in survivors if _is_probe_sleep(pid)]
        await anyio.sleep(0.05)
    if survivors:
        return Check(name, False, f"descendants {survivors} outlived their worker")
    return Check(name, True, "a kernel's children (one in its own session) died with its worker")


def _is_probe_sleep(pid: int) -> bool:
    try:
        process = psutil.Process(pid)
        return MARKER in process.cmdline() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
