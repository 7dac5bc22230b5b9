"""Sweeps on a real local Ray cluster: two nodes started with `ray start`, one core each.

Nothing is mocked: the nodes are real raylets, the agents real Ray actors running kbd's template
and workers, the head a `kbd sweep --cluster ADDRESS` process. Skipped when Ray (the `ray` extra)
is not installed. One cluster serves the whole module (starting one takes seconds).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import psutil
import pytest

from tests.conftest import FIXTURE_KB, ROOT, fixture_args, json_records, kbd, needs_kernelbench
from tests.test_faults import EXPECTED

pytest.importorskip("ray")

from kbd.cluster.localcluster import LocalCluster

CLUSTER_LEVELS = ROOT / "tests" / "fixtures" / "cluster-levels.yaml"


@pytest.fixture(scope="module")
def cluster():
    cores = sorted(os.sched_getaffinity(0))
    with LocalCluster([(cores[0],), (cores[-1],)]) as running:
        yield running


def _rows(cwd) -> list[tuple[str, str, str | None]]:
    """(kernel, outcome, node) of every attempt, in order."""
    with sqlite3.connect(cwd / ".kbd" / "results.db") as db:
        rows = db.execute("SELECT kernel, outcome, json_extract(record, '$.node') FROM attempts")
        return rows.fetchall()


def _final(cwd) -> dict[str, dict]:
    result = kbd("results", "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json_records(result.stdout)


def test_fixture_zoo_on_two_nodes_matches_a_local_sweep(cluster, tmp_path):
    junit = tmp_path / "out.xml"
    # 20 s: each node has one core, and on a busy machine (the suite runs on two workers) a quick
    # kernel took more than 10 s; the hang fixture holds one node that long meanwhile.
    args = fixture_args("--timeout", "20", "--mem-limit", "2GiB", "--junit", str(junit))
    result = kbd("sweep", *args, "--cluster", cluster.address, cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.stderr  # the faulty fixtures fail
    assert "kbd: cluster: 2 nodes" in result.stderr
    records = _final(tmp_path)
    # The same outcomes, phases and signals as the local sweep of tests/test_faults.py.
    assert {k: (r["outcome"], r["phase"], r["signal"]) for k, r in records.items()} == EXPECTED
    rows = _rows(tmp_path)
    assert len(rows) == len(EXPECTED)  # one attempt each: nothing lost, nothing retried
    assert len({node for _, _, node in rows}) == 2  # both nodes ran kernels
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == str(len(EXPECTED))
    assert "done" in kbd("sweeps", cwd=tmp_path).stdout


@needs_kernelbench
def test_ci_levels_on_two_nodes(cluster, tmp_path):
    args = ["--levels", str(ROOT / "levels" / "ci.yaml"), "--cluster", cluster.address]
    result = kbd("sweep", *args, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    assert {r["outcome"] for r in _final(tmp_path).values()} == {"pass"}


def test_killed_agent_kernels_finish_on_the_other_node(cluster, tmp_path):
    kernels = ["level9/6_", "level1/1_", "level1/2_", "level1/3_", "level1/6_"]
    args = fixture_args(*kernels, "--timeout", "8", "--cluster", cluster.address)
    head = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    busy = _wait_for(lambda: [a for a, workers in _agents(cluster).items() if workers], 180)
    assert busy, "no agent started a kernel"
    victim = busy[0]
    victim.send_signal(signal.SIGKILL)
    _, err = head.communicate(timeout=300)
    assert head.returncode == 1, err  # the hang times out
    assert "lost the kbd agent" in err
    # Nothing of kbd is left of the killed agent: no template, no worker.
    assert _wait_for(lambda: not _kbd_processes_of(victim.pid), 10), "kbd outlived its agent"

    rows = _rows(tmp_path)
    lost = [(kernel, node) for kernel, outcome, node in rows if outcome == "lost"]
    assert len(lost) == 1, rows
    records = _final(tmp_path)
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
        "--kernelbench", str(FIXTURE_KB), "--levels", str(CLUSTER_LEVELS),
        "--cluster", cluster.address, "--no-sandbox",
    ]  # fmt: skip
    result = kbd("sweep", *args, cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stderr
    rows = _rows(tmp_path)
    # Lost on one node, then the second death on the other ends it: never a third run.
    assert [outcome for _, outcome, _ in rows] == ["lost", "crash"]
    assert len({node for _, _, node in rows}) == 2
    record = _final(tmp_path)["level9/14_agent_killer"]
    assert record["message"].startswith("node agent died 2 times while running it")
    # The last phase the head heard of: the agent may die before it forwards "reference".
    assert record["phase"] in ("load", "reference")
    # Both agents are gone; a later sweep gets new ones.
    again = kbd("sweep", *fixture_args("level1/1_", "--cluster", cluster.address), cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_head_killed_then_resume_finishes_on_the_cluster(cluster, tmp_path):
    kernels = ["level9/6_", "level1/1_", "level1/2_", "level1/3_"]
    args = fixture_args(*kernels, "--timeout", "8", "--cluster", cluster.address)
    head = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    busy = _wait_for(lambda: [a for a, workers in _agents(cluster).items() if workers], 180)
    assert busy, "no agent started a kernel"
    agents = [a.pid for a in _agents(cluster)]
    head.send_signal(signal.SIGKILL)
    head.wait()
    # Ray ends the agents of a dead head; kbd's templates and workers die with them.
    gone = _wait_for(lambda: not any(_kbd_processes_of(pid) for pid in agents), 60)
    assert gone, "kbd processes outlived the head"
    recorded = len(_rows(tmp_path))
    assert recorded < len(kernels)

    resumed = kbd("sweep", "--resume", cwd=tmp_path, timeout=300)
    assert f"{len(kernels) - recorded} of {len(kernels)} kernels left" in resumed.stderr
    assert "kbd: cluster: 2 nodes" in resumed.stderr  # the stored --cluster
    records = _final(tmp_path)
    assert {k: r["outcome"] for k, r in records.items()} == {k: EXPECTED[k][0] for k in records}
    assert len(records) == len(kernels) == len(_rows(tmp_path))  # nothing ran twice


def test_unreachable_cluster_then_resume_here(tmp_path):
    result = kbd("sweep", *fixture_args("level1/1_", "--cluster", "127.0.0.1:1"), cwd=tmp_path)
    assert result.returncode == 1
    assert "--cluster 127.0.0.1:1: cannot connect to the Ray cluster" in result.stderr
    assert "Traceback" not in result.stderr
    resumed = kbd("sweep", "--resume", "--cluster", "local", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 of 1 kernels left" in resumed.stderr
    assert _final(tmp_path)["level1/1_matmul"]["node"] is None  # ran here


def _agents(cluster: LocalCluster) -> dict[psutil.Process, list[psutil.Process]]:
    """kbd agents of `cluster` (actor processes of its raylets that started a kbd template) ->
    their template's workers. Only this cluster's: other kbd processes on the machine are not
    ours to touch."""
    raylets = {p.pid for p in cluster.processes() if p.name() == "raylet"}
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "kbd.worker.template" not in cmdline:
            continue
        try:
            parent = proc.parent()
            if parent is not None and parent.pid == int(cmdline[-1]) and parent.ppid() in raylets:
                found[parent] = proc.children()
        except (psutil.Error, ValueError):
            continue
    return found


def _kbd_processes_of(agent_pid: int) -> list[psutil.Process]:
    """The template started by agent `agent_pid` and the workers it forked (same command line)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "kbd.worker.template" in cmdline and cmdline[-1] == str(agent_pid):
            found.append(proc)
    return found


def _wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return None


def test_a_node_with_other_kbd_code_is_refused(cluster, tmp_path):
    """Last in the module: it adds a third node running a modified copy of kbd."""
    copy = tmp_path / "other"
    shutil.copytree(ROOT / "kbd", copy / "kbd", ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "kbd" / "cluster" / "versions.py", "a") as source:
        source.write("# a local change\n")
    cluster.add_node((sorted(os.sched_getaffinity(0))[0],), env={"PYTHONPATH": str(copy)})
    result = kbd("sweep", *fixture_args("level1/1_", "--cluster", cluster.address), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    refused = [line for line in result.stderr.splitlines() if "refused" in line]
    assert len(refused) == 1, result.stderr
    assert re.search(r"refused: kbd [0-9a-f]{16} there, [0-9a-f]{16} here$", refused[0])
    assert "kbd: cluster: 2 nodes" in result.stderr
