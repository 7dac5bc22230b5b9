"""The scheduler's core: slots, memory admission, skipping and errors, with a fake kernel runner.

The fake stands in for `runner.run_kernel` (no worker processes): each kernel runs until the
test releases it, so the tests see exactly what runs at the same time, without sleeps.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import anyio
import pytest

from kbd.engine.scheduler import Hooks, Planned, Pool, core_slots, execute, order
from kbd.plan.catalog import Entry
from kbd.plan.limits import WORKER_BASE_BYTES
from kbd.results.record import Record
from kbd.shared.errors import TemplateError
from kbd.shared.protocol import Job, Limits, Sized

MiB = 1 << 20


def plan(
    name: str, memory: int = MiB, expected_s: float = 1.0, mem_limit=None, mode="import", **job
) -> Planned:
    kernel = f"level1/{name}.py"
    entry = Entry(kernel, "levels.yaml", None, None, None, None, None, "f32", None)
    job = Job(kernel, kernel, "", None, None, None, "f32", [], 0, 0.01, 1.0, 3,
              Limits(mem_limit=mem_limit), mode=mode, **job)  # fmt: skip
    return Planned(entry=entry, job=job, memory=memory, expected_s=expected_s)


class FakeRunner:
    """Runs 'kernels' that end when the test says so; records what ran with which cores."""

    def __init__(self, fail: dict[str, BaseException] | None = None):
        self.fail = fail or {}
        self.begun: dict[str, anyio.Event] = defaultdict(anyio.Event)
        self.gates: dict[str, anyio.Event] = defaultdict(anyio.Event)
        self.running: dict[str, tuple[int, ...]] = {}
        self.started: list[str] = []
        self.most_at_once = 0

    async def __call__(self, spawner, entry, job, **kwargs) -> Record:
        name = entry.name
        self.started.append(name)
        self.running[name] = job.limits.cores
        self.most_at_once = max(self.most_at_once, len(self.running))
        self.begun[name].set()
        try:
            if name in self.fail:
                raise self.fail[name]
            await self.gates[name].wait()
        finally:
            del self.running[name]
        return Record(kernel=name, outcome="pass", phase="check")

    async def finish(self, name: str) -> None:
        """Wait until kernel `name` runs, then let it end."""
        await self.begun[name].wait()
        self.gates[name].set()


class FakeSizer:
    """Sizes 'kernels' at once: with the Sized (or the failure Record) the test gives each."""

    def __init__(self, found: dict[str, Sized | Record]):
        self.found = found
        self.sized: list[tuple[str, tuple[int, ...]]] = []  # kernel and the cores it had

    async def __call__(self, spawner, entry, job, **kwargs) -> Sized | Record:
        self.sized.append((entry.name, job.limits.cores))
        return self.found[entry.name]


async def sweep(plans, runner, *, slots, budget=1 << 40, driver=None, size=None) -> list[Record]:
    size = size or FakeSizer({})
    records: list[Record] = []
    hooks = Hooks(finished=records.append, notice=lambda text: None)
    async with anyio.create_task_group() as group:
        if driver is not None:
            group.start_soon(driver)
        pool = Pool(sorted(core for slot in slots for core in slot), budget)
        await execute(None, plans, pool=pool, jobs=len(slots), timeout=1, log_dir=Path("/none"),
                      hooks=hooks, run=runner, size=size)  # fmt: skip
        assert pool.reserved == 0 and pool.free == pool.cores  # every admission released
    return records


def test_core_slots_are_disjoint_and_cover_the_cores():
    assert core_slots([0, 1, 2, 3], 2) == [(0, 2), (1, 3)]
    assert core_slots([0, 1], 8) == [(0,), (1,)]  # never more slots than cores
    assert core_slots([0, 1, 2], 0) == [(0, 1, 2)]


def test_longest_expected_first():
    plans = [plan("a", expected_s=1), plan("b", expected_s=5), plan("c", expected_s=5)]
    assert [p.entry.name for p in order(plans)] == ["level1/b", "level1/c", "level1/a"]


def test_one_kernel_per_slot_with_the_slots_cores():
    runner = FakeRunner()

    async def driver():
        await runner.begun["level1/a"].wait()
        await runner.begun["level1/b"].wait()
        await anyio.wait_all_tasks_blocked()
        assert runner.running == {"level1/a": (0,), "level1/b": (1,)}  # c waits for a slot
        await runner.finish("level1/a")
        await runner.begun["level1/c"].wait()
        assert runner.running["level1/c"] == (0,)  # a's slot
        await runner.finish("level1/b")
        await runner.finish("level1/c")

    plans = [plan("a"), plan("b"), plan("c")]
    records = anyio.run(lambda: sweep(plans, runner, slots=[(0,), (1,)], driver=driver))
    assert sorted(r.kernel for r in records) == ["level1/a", "level1/b", "level1/c"]
    assert runner.started[:2] == ["level1/a", "level1/b"] and runner.most_at_once == 2


def test_memory_admission_waits_for_room():
    """Two free slots, but the budget holds only one of the two kernels at a time."""
    runner = FakeRunner()

    async def driver():
        await runner.begun["level1/a"].wait()
        await anyio.wait_all_tasks_blocked()
        assert list(runner.running) == ["level1/a"]  # b has a free slot but no memory
        await runner.finish("level1/a")
        await runner.finish("level1/b")

    plans = [plan("a", memory=6 * MiB), plan("b", memory=6 * MiB)]
    anyio.run(lambda: sweep(plans, runner, slots=[(0,), (1,)], budget=10 * MiB, driver=driver))
    assert runner.most_at_once == 1


@pytest.mark.parametrize(
    ("memory", "mem_limit", "message"),
    [
        (20 * MiB, None, "needs about 20.0 MiB, more than the memory budget 10.0 MiB"),
        (WORKER_BASE_BYTES + 2 * MiB, MiB, "more than --mem-limit 1.0 MiB allows"),
    ],
)
def test_kernels_that_cannot_fit_are_skipped_without_running(memory, mem_limit, message):
    runner = FakeRunner()
    big = plan("big", memory=memory, mem_limit=mem_limit)
    records = anyio.run(lambda: sweep([big], runner, slots=[(0,)], budget=10 * MiB))
    assert runner.started == []
    (record,) = records
    assert (record.outcome, record.phase) == ("skipped", "schedule")
    assert record.message.endswith(message)


def test_a_kbd_bug_becomes_that_kernels_error_and_the_sweep_goes_on():
    runner = FakeRunner(fail={"level1/a": ValueError("oops")})

    async def driver():
        await runner.finish("level1/b")

    records = anyio.run(lambda: sweep([plan("a"), plan("b")], runner, slots=[(0,)], driver=driver))
    by_kernel = {r.kernel: r for r in records}
    assert by_kernel["level1/a"].outcome == "error"
    assert by_kernel["level1/a"].message == "kbd internal error: ValueError('oops')"
    assert by_kernel["level1/b"].outcome == "pass"


def test_a_dead_template_ends_the_sweep():
    runner = FakeRunner(fail={"level1/a": TemplateError("worker template exited")})
    with pytest.raises(BaseExceptionGroup) as info:
        anyio.run(lambda: sweep([plan("a"), plan("b")], runner, slots=[(0,)]))
    assert info.group_contains(TemplateError)
    assert runner.started[0] == "level1/a"


def test_two_sweeps_share_one_pool_without_oversubscribing_it():
    """The daemon's case: two sweeps draw cores and memory from one pool, in arrival order."""
    runner = FakeRunner()
    pool = Pool([0, 1], budget=10 * MiB)
    hooks = Hooks(notice=lambda text: None)

    async def one(names):
        plans = [plan(n, memory=4 * MiB) for n in names]
        await execute(None, plans, pool=pool, jobs=2, timeout=1, log_dir=Path("/none"),
                      hooks=hooks, run=runner)  # fmt: skip

    async def main():
        async with anyio.create_task_group() as group:
            group.start_soon(one, ["a1", "a2"])
            await runner.begun["level1/a1"].wait()
            group.start_soon(one, ["b1", "b2"])
            await runner.begun["level1/a2"].wait()
            await anyio.wait_all_tasks_blocked()
            assert sorted(runner.running.values()) == [(0,), (1,)]  # b1 waits: no core free
            await runner.finish("level1/a1")
            await runner.begun["level1/b1"].wait()  # b1 takes the core a1 freed
            for name in ("a2", "b1", "b2"):
                await runner.finish(f"level1/{name}")

    anyio.run(main)
    assert runner.most_at_once == 2
    assert runner.started == ["level1/a1", "level1/a2", "level1/b1", "level1/b2"]
    assert pool.reserved == 0 and pool.free == [0, 1]


def _sized(input_mib: int, flops: int | None = 10**9) -> Sized:
    return Sized(
        inputs=[f"{input_mib}x262144xf32"],
        input_bytes=[input_mib * MiB],
        output_bytes=input_mib * MiB,
        param_bytes=0,
        flops=flops,
    )


def test_kernels_at_their_own_shapes_are_sized_first_and_admitted_by_that_size():
    """--shapes kernelbench: each kernel is sized on the cores it will have, then skipped or
    admitted by the estimate of the shapes it has; a failed sizing is that kernel's record."""
    own = {"shapes": "kernelbench"}
    failed = Record(kernel="level1/bad", outcome="crash", phase="size", signal="SIGSEGV")
    sizer = FakeSizer(
        {"level1/small": _sized(1), "level1/huge": _sized(64 * 1024), "level1/bad": failed}
    )
    runner = FakeRunner()

    async def driver():
        await runner.finish("level1/small")

    plans = [plan("huge", **own), plan("bad", **own), plan("small", **own)]
    budget = WORKER_BASE_BYTES + 64 * MiB
    records = anyio.run(
        lambda: sweep(plans, runner, slots=[(0,)], budget=budget, driver=driver, size=sizer)
    )
    by_kernel = {r.kernel: r for r in records}
    assert [name for name, _ in sizer.sized] == ["level1/huge", "level1/bad", "level1/small"]
    assert all(cores == (0,) for _, cores in sizer.sized)
    assert runner.started == ["level1/small"]  # only it fits; none ran unsized
    huge = by_kernel["level1/huge"]
    assert (huge.outcome, huge.phase) == ("skipped", "schedule")
    assert huge.message.startswith("needs about 256.7 GiB for inputs 65536x262144xf32, more than")
    assert huge.inputs == ["65536x262144xf32"] and huge.shapes == "kernelbench"
    assert by_kernel["level1/bad"] == failed
    assert by_kernel["level1/small"].outcome == "pass"


def test_a_kernel_in_both_modes_is_sized_once():
    own = {"shapes": "kernelbench"}
    sizer = FakeSizer({"level1/k": _sized(1)})
    runner = FakeRunner()

    async def driver():
        await runner.finish("level1/k")  # both modes: the gate stays open

    both = [plan("k", mode="import", **own), plan("k", mode="compile", **own)]
    anyio.run(lambda: sweep(both, runner, slots=[(0,)], driver=driver, size=sizer))
    assert len(sizer.sized) == 1 and runner.started == ["level1/k", "level1/k"]


def test_levels_shapes_are_never_sized():
    sizer = FakeSizer({})
    runner = FakeRunner()

    async def driver():
        await runner.finish("level1/a")

    anyio.run(lambda: sweep([plan("a")], runner, slots=[(0,)], driver=driver, size=sizer))
    assert sizer.sized == [] and runner.started == ["level1/a"]
