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
# the fixture kernels in the form of lighthouse's levels files, one entry with a `warning`
LIGHTHOUSE_FORM = ROOT / "tests" / "fixtures" / "lighthouse.yaml"
LIGHTHOUSE_WARNING = "WARNING: error: Dialect `tm_tensor' not found for custom op 'tm_tensor.scan'"
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


# In parallel (`scripts/test` runs pytest-xdist workers) a test module that sets up a
# module-scoped fixture (one sweep, one daemon, one Ray cluster) runs whole on one worker, so that
# the fixture is set up once; the tests of every other module are independent and are spread over
# the workers one by one. `test_repository.py` checks that WHOLE_MODULES names exactly the modules
# with a module-scoped fixture. (xdist's own `--dist loadgroup` cannot be used: it marks groups by
# rewriting item._nodeid, which pytest 9 no longer reads.)
WHOLE_MODULES = {
    "test_cli.py",
    "test_cluster.py",
    "test_cluster_faults.py",
    "test_compile_mode.py",
    "test_containment.py",
    "test_daemon.py",
    "test_daemon_sweeps.py",
    "test_dtypes.py",
    "test_faults.py",
    "test_levels.py",
    "test_replay.py",
    "test_schedules.py",
    "test_tune_daemon.py",
}
# The longest work units (a whole module, or one test of a spread module) start first, so that
# the workers finish at about the same time. Only the order depends on this list.
LONGEST_FIRST = (
    "test_cluster.py",
    "test_cluster_faults.py",
    "test_compile_cache.py::test_reruns_use_both_caches_with_the_same_results",
    "test_sweep.py::test_kill_9_leaves_no_worker_and_resume_completes",
    "test_daemon.py",
    "test_daemon_sweeps.py",
    "test_tune_daemon.py",
    "test_compile_mode.py",
    "test_sweep.py::test_template_death_ends_the_sweep_cleanly_and_resume_completes",
    "test_sweep.py::test_ctrl_c_finishes_running_kernels_then_resume",
    "test_containment.py",
    "test_faults.py",
    "test_cli.py",
    "test_replay.py",
    "test_large_shapes.py",
    "test_schedules.py",
    "test_quiet.py",
    "test_bench.py",
    "test_levels.py",
    "test_update_xfail.py",
    "test_dumps.py",
)


def _module_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def _unit(nodeid: str) -> str:
    """The work unit a test belongs to: its module, or the test itself (without parameters)."""
    name = _module_name(nodeid)
    if name in WHOLE_MODULES:
        return name
    return name + "::" + nodeid.split("::", 1)[1].split("[", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            name = _module_name(nodeid)
            return name if name in WHOLE_MODULES else nodeid

    config.option.loadscopereorder = False  # keep the order set below
    return ByUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: keep pytest's order
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        unit = _unit(item.nodeid)
        return rank.get(unit, rank.get(_module_name(item.nodeid), len(rank)))

    items.sort(key=key)  # stable
