"""A job carries everything a worker needs: it runs with no KernelBench and no schedules folder.

This is what lets a cluster node run kernels without a checkout (kbd.cluster ships jobs as they
are). The jobs are planned from copies that are deleted before the worker runs them.
"""

from __future__ import annotations

import os
import shutil

import anyio

from kbd.engine import prepare
from kbd.engine.scheduler import Hooks, run_plan
from kbd.engine.spawner import Spawner
from kbd.plan import spec
from tests.conftest import FIXTURE_KB, FIXTURE_LEVELS, ROOT


def test_jobs_run_after_kernelbench_and_schedules_are_gone(tmp_path):
    kb = tmp_path / "KernelBench"
    shutil.copytree(FIXTURE_KB / "level1", kb / "level1")
    schedules = tmp_path / "schedules"
    shutil.copytree(ROOT / "schedules", schedules)
    options = spec.SweepSpec(
        kernels=("level1/1_", "level1/4_"),
        levels=(str(FIXTURE_LEVELS),),
        kernelbench=str(kb),
        pipeline=(str(schedules / "tiled-lowering.yaml"),),  # with a transform script
    )
    plans = prepare.plan(options, None)
    cores = tuple(sorted(os.sched_getaffinity(0)))
    assert any(stage.kind == "transform" and stage.script for stage in plans[0].job.stages)
    shutil.rmtree(kb)
    shutil.rmtree(schedules)
    elsewhere = tmp_path / "node"
    elsewhere.mkdir()

    async def run_all():
        async with Spawner.started(dict(os.environ), elsewhere / "template.log") as spawner:
            return [
                await run_plan(spawner, p, cores, timeout=120, log_dir=elsewhere, hooks=Hooks())
                for p in plans
            ]

    records = anyio.run(run_all)
    assert {r.kernel: r.outcome for r in records} == {
        "level1/1_matmul": "pass",
        "level1/4_conv2d": "pass",
    }, records
