"""Shared helpers: run kbd as a user would, against the fixture KernelBench."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_KB = ROOT / "tests" / "fixtures" / "KernelBench"
FIXTURE_LEVELS = ROOT / "tests" / "fixtures" / "levels.yaml"
REAL_KB = ROOT / "third_party" / "KernelBench" / "KernelBench"


def kbd(*args: str, cwd: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m kbd ARGS` in `cwd` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "kbd", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def json_records(stdout: str) -> dict[str, dict]:
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {r["kernel"]: r for r in records}


def fixture_args(*extra: str) -> list[str]:
    return ["--kernelbench", str(FIXTURE_KB), "--levels", str(FIXTURE_LEVELS), *extra]


needs_kernelbench = pytest.mark.skipif(
    not (REAL_KB / "level1").is_dir(), reason="KernelBench is not checked out"
)


# In parallel (`scripts/test` runs two pytest-xdist workers) each test module runs whole on one
# worker, in its own order, so that a module-scoped fixture (one sweep, one daemon, one Ray
# cluster) is set up once. Modules named together in SAME_WORKER share a worker because they must
# not overlap: the fault zoo's orphan check looks machine-wide for the orphan fixture's children,
# and the cluster sweep runs that fixture too. (xdist's own `--dist loadgroup` cannot be used: it
# marks groups by rewriting item._nodeid, which pytest 9 no longer reads.)
SAME_WORKER = {"test_cluster.py": "fault zoo", "test_faults.py": "fault zoo"}
# The longest modules start first, so that both workers finish at about the same time. Only the
# order depends on this list.
LONGEST_FIRST = (
    "test_cluster.py",
    "test_faults.py",
    "test_sweep.py",
    "test_daemon.py",
    "test_containment.py",
    "test_daemon_sweeps.py",
    "test_compile_cache.py",
    "test_compile_mode.py",
    "test_schedules.py",
    "test_cli.py",
    "test_replay.py",
    "test_bench.py",
)


def _module_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            name = _module_name(nodeid)
            return SAME_WORKER.get(name, name)

    config.option.loadscopereorder = False  # keep the order set below
    return ByModule(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: keep pytest's order
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module_name(item.nodeid), len(rank)))  # stable
