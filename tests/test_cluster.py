"""Sweeps on a real local Ray cluster: two nodes started with `ray start`, one core each.

Nothing is mocked: the nodes are real raylets, the agents real Ray actors running kbd's template
and workers, the head a `kbd sweep --cluster ADDRESS` process. Skipped when Ray (the `ray` extra)
is not installed. One cluster serves the whole module (starting one takes seconds); the tests
that kill an agent or the head are in test_cluster_faults.py, with a cluster of their own, so that
the two modules run on two pytest workers at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import xml.etree.ElementTree as ET

import pytest

from kbd.plan import target
from tests import clusters
from tests.conftest import ROOT, fixture_args, kbd, needs_kernelbench
from tests.test_faults import EXPECTED
from tests.test_kernelbench_shapes import OWN_TWO, OWN_TWO_ENDS, ends
from tests.test_tune import QUICK, tunable

pytestmark = clusters.needs_ray


@pytest.fixture(scope="module")
def cluster():
    yield from clusters.two_nodes()


def test_fixture_zoo_on_two_nodes_matches_a_local_sweep(cluster, tmp_path):
    junit = tmp_path / "out.xml"
    # 20 s: each node has one core, and on a busy machine (the suite runs on two workers) a quick
    # kernel took more than 10 s; the hang fixture holds one node that long meanwhile.
    args = fixture_args("--timeout", "20", "--mem-limit", "2GiB", "--junit", str(junit))
    result = kbd("sweep", *args, "--cluster", cluster.address, cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.stderr  # the faulty fixtures fail
    assert "kbd: cluster: 2 nodes" in result.stderr
    records = clusters.final(tmp_path)
    # The same outcomes, phases and signals as the local sweep of tests/test_faults.py.
    assert {k: (r["outcome"], r["phase"], r["signal"]) for k, r in records.items()} == EXPECTED
    rows = clusters.rows(tmp_path)
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
    assert {r["outcome"] for r in clusters.final(tmp_path).values()} == {"pass"}


def test_kernelbench_shapes_on_two_nodes(cluster, tmp_path):
    """--shapes kernelbench travels in the spec and the job: each agent sizes its kernels first
    and skips the one whose inputs would not fit, as a local sweep does."""
    result = kbd("sweep", *OWN_TWO, "--cluster", cluster.address, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    records = clusters.final(tmp_path)
    assert ends(records) == OWN_TWO_ENDS
    assert all(r["node"] for r in records.values())  # both ran on the cluster


def test_unreachable_cluster_then_resume_here(tmp_path):
    result = kbd("sweep", *fixture_args("level1/1_", "--cluster", "127.0.0.1:1"), cwd=tmp_path)
    assert result.returncode == 1
    assert "--cluster 127.0.0.1:1: cannot connect to the Ray cluster" in result.stderr
    assert "Traceback" not in result.stderr
    resumed = kbd("sweep", "--resume", "--cluster", "local", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 of 1 kernels left" in resumed.stderr
    assert clusters.final(tmp_path)["level1/1_matmul"]["node"] is None  # ran here


def test_tune_on_two_nodes_each_task_on_one_node(cluster, tmp_path):
    """Two kernels tuned at once, each whole task (search and confirmation) on one node; trials
    and adopted configurations in the head's store, keyed by the node's CPU and threads. The
    head plans no task for itself: with -j 1 its workers would have every core of this
    machine, the nodes' one, and no task is recorded under the head's key."""
    quick = tunable(tmp_path, ["ok", "wrong"])
    args = fixture_args("level1/1_", "level1/4_", "--pipeline", str(quick), *QUICK, "-j", "1")
    result = kbd("tune", *args, "--cluster", cluster.address, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "kbd: cluster: 2 nodes" in result.stderr
    with sqlite3.connect(tmp_path / ".kbd" / "results.db") as db:
        trials = db.execute(
            "SELECT kernel, stage, json_extract(record, '$.node') FROM trials"
        ).fetchall()
        keys = [json.loads(k) for (k,) in db.execute("SELECT key FROM tuned ORDER BY kernel")]
        tasks = sorted(t for (t,) in db.execute("SELECT task FROM tune_tasks"))
        adopted = sorted(t for (t,) in db.execute("SELECT task FROM tuned"))
        status = db.execute("SELECT status FROM tunes").fetchall()
    nodes = {kernel: {node for k, _, node in trials if k == kernel} for kernel, _, _ in trials}
    assert set(nodes) == {"level1/1_matmul", "level1/4_conv2d"}
    assert all(len(where) == 1 and None not in where for where in nodes.values()), nodes
    assert nodes["level1/1_matmul"] != nodes["level1/4_conv2d"]  # both nodes, at once
    assert sum(1 for _, stage, _ in trials if stage == "search") == 6
    assert [(k["cpu"], k["threads"]) for k in keys] == [(target.cpu_model(), 1)] * 2
    assert tasks == adopted and len(tasks) == 2  # the nodes' keys, none of the head's
    assert status == [("done",)]


def test_a_node_with_other_kbd_code_is_refused(cluster, tmp_path):
    """Last in the module: it adds a third node running a modified copy of kbd."""
    copy = tmp_path / "other"
    shutil.copytree(ROOT / "kbd", copy / "kbd", ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "kbd" / "cluster" / "wire.py", "a") as source:
        source.write("# a local change\n")
    cluster.add_node((sorted(os.sched_getaffinity(0))[0],), env={"PYTHONPATH": str(copy)})
    result = kbd("sweep", *fixture_args("level1/1_", "--cluster", cluster.address), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    refused = [line for line in result.stderr.splitlines() if "refused" in line]
    assert len(refused) == 1, result.stderr
    assert re.search(r"refused: kbd [0-9a-f]{16} there, [0-9a-f]{16} here$", refused[0])
    assert "kbd: cluster: 2 nodes" in result.stderr
