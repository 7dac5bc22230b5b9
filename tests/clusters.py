"""What the cluster tests (test_cluster.py, test_cluster_faults.py) share: their two-node
cluster and ways to look at what a cluster sweep stored and which processes it runs."""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import time
from collections.abc import Iterator

import psutil
import pytest

from kbd.cluster.localcluster import LocalCluster
from tests.conftest import ROOT, json_records, kbd

CLUSTER_LEVELS = ROOT / "tests" / "fixtures" / "cluster-levels.yaml"

# Looked up, not imported: every pytest worker collects the cluster modules, and importing Ray
# costs ~1 s of CPU in each (the tests run Ray in kbd's own processes).
needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray (the `ray` extra) is not installed"
)


def two_nodes() -> Iterator[LocalCluster]:
    """A local cluster of two nodes, one core each (the body of a module-scoped fixture)."""
    cores = sorted(os.sched_getaffinity(0))
    with LocalCluster([(cores[0],), (cores[-1],)]) as running:
        yield running


def rows(cwd) -> list[tuple[str, str, str | None]]:
    """(kernel, outcome, node) of every attempt, in order."""
    with sqlite3.connect(cwd / ".kbd" / "results.db") as db:
        rows = db.execute("SELECT kernel, outcome, json_extract(record, '$.node') FROM attempts")
        return rows.fetchall()


def final(cwd) -> dict[str, dict]:
    result = kbd("results", "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json_records(result.stdout)


def agents(cluster: LocalCluster) -> dict[psutil.Process, list[psutil.Process]]:
    """kbd agents of `cluster` (actor processes of its raylets that started a kbd template) ->
    their template's workers. Only this cluster's: other kbd processes on the machine are not
    ours to touch."""
    raylets = {p.pid for p in cluster.raylets()}
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


def kbd_processes_of(agent_pid: int) -> list[psutil.Process]:
    """The template started by agent `agent_pid` and the workers it forked (same command line)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "kbd.worker.template" in cmdline and cmdline[-1] == str(agent_pid):
            found.append(proc)
    return found


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return None
