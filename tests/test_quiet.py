"""Benchmarks timed alone (kbd/bench/quiet.py), on real processes: who is stopped when, and
what happens to the deadlines of the paused."""

from __future__ import annotations

import math
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import anyio
import pytest

from kbd.bench.quiet import Quiet, TimedAlone
from kbd.shared import protocol
from kbd.shared.protocol import QuietGranted
from tests.conftest import fixture_args, json_records, kbd


@contextmanager
def _sleepers(count: int) -> Iterator[list[int]]:
    """`count` real processes, each leading its own process group, like workers."""
    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _state(pid: int) -> str:
    """R, S, T, ... from /proc (the field after the parenthesized command name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _states(pids: list[int], want: list[str]) -> list[str]:
    """The processes' states, once they are `want` or after 5 s: a signal is delivered
    asynchronously, so a change of state takes a moment to show in /proc."""
    for _ in range(500):
        states = [_state(pid) for pid in pids]
        if states == want:
            break
        time.sleep(0.01)
    return states


def _run(test) -> None:
    anyio.run(test)


def test_the_holder_runs_and_every_other_worker_is_stopped_until_it_releases():
    async def test():
        quiet = Quiet()
        with _sleepers(3) as pids, ExitStack() as stack:
            workers = [stack.enter_context(quiet.running(pid, anyio.CancelScope())) for pid in pids]
            assert await quiet.acquire(workers[0])
            assert _states(pids, ["S", "T", "T"]) == ["S", "T", "T"]
            quiet.release(workers[0])
            assert _states(pids, ["S", "S", "S"]) == ["S", "S", "S"]

    _run(test)


def test_a_worker_started_while_another_is_timed_is_stopped_at_once_and_shown_so():
    async def test():
        quiet = Quiet()
        shown: list[bool] = []
        with _sleepers(2) as (first, second), quiet.running(first, anyio.CancelScope()) as holder:
            assert await quiet.acquire(holder)
            with quiet.running(second, anyio.CancelScope(), shown.append):
                assert _states([second], ["T"]) == ["T"]
                assert shown == [True]
                quiet.release(holder)
                assert _states([second], ["S"]) == ["S"]
                assert shown == [True, False]

    _run(test)


def test_one_holder_at_a_time_in_the_order_they_asked():
    async def test():
        quiet = Quiet()
        order: list[str] = []
        with _sleepers(3) as pids, ExitStack() as stack:
            a, b, c = (stack.enter_context(quiet.running(p, anyio.CancelScope())) for p in pids)
            assert await quiet.acquire(a)

            async def take(name: str, worker) -> None:
                assert await quiet.acquire(worker)
                order.append(name)
                quiet.release(worker)

            async with anyio.create_task_group() as group:
                group.start_soon(take, "b", b)
                await anyio.sleep(0.05)
                group.start_soon(take, "c", c)
                await anyio.sleep(0.05)
                assert order == []  # a still holds it
                quiet.release(a)
            assert order == ["b", "c"]

    _run(test)


def test_a_paused_workers_deadline_stands_still_and_resumes_with_what_was_left():
    async def test():
        quiet = Quiet()
        with _sleepers(2) as (first, second):
            with (
                quiet.running(first, anyio.CancelScope()) as holder,
                anyio.move_on_after(0.3) as deadline,
                quiet.running(second, deadline) as paused,
            ):
                assert await quiet.acquire(holder)
                assert deadline.deadline == math.inf
                await anyio.sleep(0.5)  # longer than the paused worker's whole deadline
                quiet.release(holder)
                left = deadline.deadline - anyio.current_time()
                assert 0.2 < left <= 0.3
            assert not deadline.cancelled_caught
            # what its record reports as paused (its phase times include it)
            assert 0.5 <= paused.paused_s < 1.0 and holder.paused_s == 0.0

    _run(test)


def test_a_holder_that_ends_gives_the_token_back_and_continues_the_others():
    async def test():
        quiet = Quiet()
        with _sleepers(2) as (first, second), quiet.running(second, anyio.CancelScope()) as other:
            with quiet.running(first, anyio.CancelScope()) as holder:
                assert await quiet.acquire(holder)
                assert _states([second], ["T"]) == ["T"]
            assert _states([second], ["S"]) == ["S"]  # ended without releasing: running() did
            assert await quiet.acquire(other)  # the token is free again
            quiet.release(other)

    _run(test)


def test_a_worker_that_ended_while_waiting_does_not_keep_the_token():
    async def test():
        quiet = Quiet()
        with _sleepers(2) as (first, second), quiet.running(first, anyio.CancelScope()) as holder:
            assert await quiet.acquire(holder)
            with quiet.running(second, anyio.CancelScope()) as gone:
                pass
            async with anyio.create_task_group() as group:

                async def late() -> None:
                    assert not await quiet.acquire(gone)

                group.start_soon(late)
                await anyio.sleep(0.05)
                quiet.release(holder)
            assert await quiet.acquire(holder)  # still free
            quiet.release(holder)

    _run(test)


def test_timed_alone_grants_the_token_at_the_bench_phase_and_gives_it_back_when_done():
    """The supervisor's side for one worker, on a real channel: phases before `bench` change
    nothing; at `bench` the others are stopped and the worker gets `QuietGranted`; `done`
    continues them and frees the token."""

    async def test():
        quiet = Quiet()
        ours, theirs = socket.socketpair()
        with (
            _sleepers(2) as (first, second),
            theirs,
            quiet.running(first, anyio.CancelScope()) as worker,
            quiet.running(second, anyio.CancelScope()) as other,
        ):
            channel = await anyio.abc.UNIXSocketStream.from_socket(ours)
            async with channel, anyio.create_task_group() as group:
                alone = TimedAlone(quiet, worker, channel, group)
                alone.phase("check")
                await anyio.sleep(0.05)
                assert _states([first, second], ["S", "S"]) == ["S", "S"]
                alone.phase("bench")
                granted = await anyio.to_thread.run_sync(
                    protocol.receive_blocking, theirs, QuietGranted
                )
                assert granted == QuietGranted()
                assert _states([first, second], ["S", "T"]) == ["S", "T"]
                alone.done()
                assert _states([second], ["S"]) == ["S"]
                assert await quiet.acquire(other)  # the token is free again
                quiet.release(other)

    _run(test)


@pytest.mark.parametrize("alone", [True, False])
def test_benchmark_sweeps_at_two_jobs_end_with_figures_either_way(tmp_path: Path, alone: bool):
    """End to end: the workers wait for (or, with --bench-concurrently, skip) the grant."""
    # One process per kernel: the grant is what is tested here (processes: test_bench.py).
    quick = ["--bench-time", "0.05", "--bench-samples", "3", "--bench-processes", "1"]
    option = [] if alone else ["--bench-concurrently"]
    selection = fixture_args("level1/2_", "level1/3_", "-j", "2", "--benchmark", *quick, *option)
    result = kbd("sweep", *selection, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = json_records(kbd("results", "--json", cwd=tmp_path).stdout)
    assert {kernel: r["outcome"] for kernel, r in records.items()} == {
        "level1/2_relu_scale": "pass",
        "level1/3_sum_reduction": "pass",
    }
    assert all(r["bench"]["compiled"]["n"] >= 3 for r in records.values())
    assert all(r["paused_s"] >= 0.0 for r in records.values())  # stored with each record
