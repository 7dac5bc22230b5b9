"""Sweeps on a real local Ray cluster that lose a kbd agent or their head: the kernels of a
killed agent finish on the other node, a kernel in flight during two agent deaths is a crash,
and a killed head leaves nothing behind and resumes; a tune whose agent is killed finishes its
task on the other node. Nothing is mocked (see test_cluster.py).
This module has a two-node cluster of its own, so that it runs beside test_cluster.py.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys

import pytest

from tests import clusters
from tests.conftest import FIXTURE_KB, fixture_args, kbd
from tests.test_faults import EXPECTED
from tests.test_tune import QUICK, trials_of, tunable

pytestmark = clusters.needs_ray


@pytest.fixture(scope="module")
def cluster():
    yield from clusters.two_nodes()


def test_killed_agent_kernels_finish_on_the_other_node(cluster, tmp_path):
    kernels = ["level9/6_", "level1/1_", "level1/2_", "level1/3_", "level1/6_"]
    # -O0 and 8 s, as in test_sweep.py: on a loaded machine a quick kernel compiled at -O3 on a
    # one-core node took more than 8 s; the hang holds a node that long meanwhile.
    args = fixture_args(*kernels, "-O", "0", "--timeout", "8", "--cluster", cluster.address)
    head = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    busy = clusters.wait_for(
        lambda: [a for a, workers in clusters.agents(cluster).items() if workers], 180
    )
    assert busy, "no agent started a kernel"
    victim = busy[0]
    victim.send_signal(signal.SIGKILL)
    _, err = head.communicate(timeout=300)
    assert head.returncode == 1, err  # the hang times out
    assert "lost the kbd agent" in err
    # Nothing of kbd is left of the killed agent: no template, no worker.
    assert clusters.wait_for(lambda: not clusters.kbd_processes_of(victim.pid), 10), (
        "kbd outlived its agent"
    )

    rows = clusters.rows(tmp_path)
    lost = [(kernel, node) for kernel, outcome, node in rows if outcome == "lost"]
    assert len(lost) == 1, rows
    records = clusters.final(tmp_path)
    assert {k: r["outcome"] for k, r in records.items()} == {
        k: EXPECTED[k][0] for k in records
    }  # exactly one final outcome per kernel, the right one
    assert len(records) == len(kernels)
    kernel, lost_on = lost[0]
    assert records[kernel]["node"] != lost_on  # it finished on the other node
    assert len(rows) == len(kernels) + 1


def test_kernel_in_flight_during_two_agent_deaths_is_a_crash(cluster, tmp_path):
    # Without containment: Landlock's signal scoping would stop the kernel from killing its agent.
    args = [
        "--kernelbench", str(FIXTURE_KB), "--levels", str(clusters.CLUSTER_LEVELS),
        "--cluster", cluster.address, "--no-sandbox",
    ]  # fmt: skip
    result = kbd("sweep", *args, cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stderr
    rows = clusters.rows(tmp_path)
    # Lost on one node, then the second death on the other ends it: never a third run.
    assert [outcome for _, outcome, _ in rows] == ["lost", "crash"]
    assert len({node for _, _, node in rows}) == 2
    record = clusters.final(tmp_path)["level9/14_agent_killer"]
    assert record["message"].startswith("node agent died 2 times while running it")
    # The last phase the head heard of: the agent may die before it forwards "load" or
    # "reference" (the kernel kills it from its forward pass), but never a later one.
    assert record["phase"] in ("start", "load", "reference")
    # Both agents are gone; a later sweep gets new ones.
    again = kbd("sweep", *fixture_args("level1/1_", "--cluster", cluster.address), cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_head_killed_then_resume_finishes_on_the_cluster(cluster, tmp_path):
    kernels = ["level9/6_", "level1/1_", "level1/2_", "level1/3_"]
    args = fixture_args(*kernels, "-O", "0", "--timeout", "8", "--cluster", cluster.address)
    head = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    busy = clusters.wait_for(
        lambda: [a for a, workers in clusters.agents(cluster).items() if workers], 180
    )
    assert busy, "no agent started a kernel"
    agents = [a.pid for a in clusters.agents(cluster)]
    head.send_signal(signal.SIGKILL)
    head.wait()
    # Ray ends the agents of a dead head; kbd's templates and workers die with them.
    gone = clusters.wait_for(lambda: not any(clusters.kbd_processes_of(pid) for pid in agents), 60)
    assert gone, "kbd processes outlived the head"
    recorded = len(clusters.rows(tmp_path))
    assert recorded < len(kernels)

    resumed = kbd("sweep", "--resume", cwd=tmp_path, timeout=300)
    assert f"{len(kernels) - recorded} of {len(kernels)} kernels left" in resumed.stderr
    assert "kbd: cluster: 2 nodes" in resumed.stderr  # the stored --cluster
    records = clusters.final(tmp_path)
    assert {k: r["outcome"] for k, r in records.items()} == {k: EXPECTED[k][0] for k in records}
    assert len(records) == len(kernels) == len(clusters.rows(tmp_path))  # nothing ran twice


def test_a_tune_whose_agent_is_killed_finishes_its_task_on_the_other_node(cluster, tmp_path):
    """The node tuning the kernel loses its agent mid-search: the task goes to the other node
    (the same CPU, so the same key: it continues), no configuration is measured twice, and the
    session ends done with a verdict."""
    quick = tunable(tmp_path, ["ok", "hang"])
    args = fixture_args("level1/1_", "--pipeline", str(quick), *QUICK, "--timeout", "8")
    head = subprocess.Popen(
        [sys.executable, "-m", "kbd", "tune", *args, "--cluster", cluster.address],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    busy = clusters.wait_for(
        lambda: [a for a, workers in clusters.agents(cluster).items() if workers], 180
    )
    assert busy, "no agent started a candidate"
    busy[0].send_signal(signal.SIGKILL)
    out, err = head.communicate(timeout=300)
    assert head.returncode == 0, err
    assert "kbd: cluster: lost the kbd agent" in err
    assert err.count("level1/1_matmul: tuning on") == 2  # the first node, then the other
    searched = [config for _, config, stage, *_ in trials_of(tmp_path / ".kbd" / "results.db")
                if stage == "search"]  # fmt: skip
    assert len(searched) == len(set(searched)) <= 3, searched  # none twice
    assert "level1/1_matmul" in out  # the summary row
    with sqlite3.connect(tmp_path / ".kbd" / "results.db") as db:
        assert db.execute("SELECT status FROM tunes").fetchall() == [("done",)]
        assert db.execute("SELECT COUNT(*) FROM tuned").fetchone() == (1,)
