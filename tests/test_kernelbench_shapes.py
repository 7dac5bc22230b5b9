"""`--shapes kernelbench`: each kernel with its problem's own get_inputs() and get_init_inputs(),
sized first on the meta device, skipped when its inputs would not fit, keyed in the caches by
the shapes it ran at.

The levels file (tests/fixtures/own-shapes.yaml) gives the fixture kernels other shapes than
their problems' own, init args that do not fit those, wrong output shapes and absurd gflops: a
run at KernelBench's shapes passes only if none of that is used.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from kbd.engine import prepare, scheduler
from kbd.plan import catalog, limits, pipelines
from kbd.plan.spec import SweepSpec
from kbd.shared.protocol import Sized
from tests.conftest import FIXTURE_KB, json_records, kbd

LEVELS = Path(__file__).resolve().parent / "fixtures" / "own-shapes.yaml"
ARGS = ("--kernelbench", str(FIXTURE_KB), "--levels", str(LEVELS), "--json", "--no-daemon")
HUGE = "level1/11_huge_input"
HUGE_INPUT = f"{1 << 17}x{1 << 17}xf32"  # 64 GiB of f32
# `--shapes kernelbench level1/1_ level1/11_` of LEVELS, as every way of running it must end:
# (outcome, shapes, inputs, message) by kernel (tests/test_daemon_sweeps.py, test_cluster.py)
OWN_TWO = ("--kernelbench", str(FIXTURE_KB), "--levels", str(LEVELS), "--shapes", "kernelbench",
           "level1/1_", "level1/11_")  # fmt: skip
OWN_TWO_ENDS = {
    "level1/1_matmul": ("pass", "kernelbench", ["32x48xf32", "48x16xf32"], ""),
    HUGE: (
        "skipped",
        "kernelbench",
        [HUGE_INPUT],
        f"needs about 256.7 GiB for inputs {HUGE_INPUT}, more than --mem-limit 4.0 GiB allows",
    ),
}


def ends(records: dict[str, dict]) -> dict[str, tuple]:
    return {k: (r["outcome"], r["shapes"], r["inputs"], r["message"]) for k, r in records.items()}


def test_kernels_run_with_their_own_inputs_and_the_caches_keep_shapes_apart(tmp_path):
    # At the levels entries' shapes first: other inputs, and the caches filled at them.
    levels = kbd("run", *ARGS, "level1/1_", "level1/4_", cwd=tmp_path)
    at_levels = json_records(levels.stdout)
    assert levels.returncode == 0, levels.stderr
    assert at_levels["level1/1_matmul"]["shapes"] == "levels"
    assert at_levels["level1/1_matmul"]["inputs"] == ["8x8xf32xrnd", "8x4xf32xrnd"]
    assert at_levels["level1/4_conv2d"]["inputs"] == ["1x5x8x8xf32xrnd"]

    own = kbd("run", *ARGS, "--shapes", "kernelbench", cwd=tmp_path)
    records = json_records(own.stdout)
    assert own.returncode == 1, own.stderr  # the two faulty fixtures
    expected_inputs = {
        "level1/1_matmul": ["32x48xf32", "48x16xf32"],
        "level1/4_conv2d": ["2x3x12x12xf32"],  # with get_init_inputs()'s 3 in-channels
        "level1/2_relu_scale": ["8x64xf32", "2.5"],  # a Python scalar, as the problem gives it
        "level1/5_cross_entropy": ["16x10xf32", "16xi64"],  # its dtypes, a 0-d output
    }
    for name, inputs in expected_inputs.items():
        record = records[name]
        assert (record["outcome"], record["phase"]) == ("pass", "check"), record["message"]
        assert record["shapes"] == "kernelbench"
        assert record["inputs"] == inputs
    # the same kernel at other shapes never gets the entries made at the levels shapes
    for name in ("level1/1_matmul", "level1/4_conv2d"):
        assert records[name]["import_cache"] == records[name]["compile_cache"] == "miss"
    # each kernel was sized in a worker of its own first, with a log of its own
    log = tmp_path / records["level1/1_matmul"]["log"]
    sizing = log.with_name(log.name.removesuffix(".log") + ".size.log").read_text()
    assert "[kbd] phase size" in sizing
    # faults while sized: a forward that raises on meta too is sized without outputs and fails
    # in its reference; one that kills its worker does so while sized
    raised = records["level9/2_raise"]
    assert (raised["outcome"], raised["phase"]) == ("error", "reference")
    segfault = records["level9/3_segfault"]
    assert (segfault["outcome"], segfault["phase"], segfault["signal"]) == (
        "crash",
        "size",
        "SIGSEGV",
    )

    # At KernelBench's shapes again: now its own entries are there to reuse.
    again = json_records(
        kbd("run", *ARGS, "--shapes", "kernelbench", "level1/1_", cwd=tmp_path).stdout
    )
    assert again["level1/1_matmul"]["outcome"] == "pass"
    assert again["level1/1_matmul"]["compile_cache"] == "hit"


def test_huge_inputs_are_skipped_without_being_made(tmp_path):
    # quickly: a template start and one sizing on the meta device, no 64 GiB of random numbers
    result = kbd("run", *ARGS, "--shapes", "kernelbench", HUGE, cwd=tmp_path, timeout=120)
    record = json_records(result.stdout)[HUGE]
    assert result.returncode == 0, result.stderr  # skipped is no failure
    # 64 GiB in, 64 GiB out, each held twice, plus the worker: had the input been made under
    # the 4 GiB cap the kernel would have ended as `memory`, not skipped before it ran
    assert (record["outcome"], record["phase"]) == ("skipped", "schedule")
    assert record["message"] == (
        f"needs about 256.7 GiB for inputs {HUGE_INPUT}, more than --mem-limit 4.0 GiB allows"
    )
    assert record["shapes"] == "kernelbench" and record["inputs"] == [HUGE_INPUT]


def test_help_explains_the_option():
    text = kbd("run", "--help", cwd=Path.cwd()).stdout
    assert "{smoke,bench,kernelbench}" in text
    assert "get_inputs() and get_init_inputs()" in " ".join(text.split())


# --- planning: what the supervisor makes of a kernel at its own shapes -----------------------


def _plan(tmp_path: Path, **options) -> scheduler.Planned:
    spec = SweepSpec(
        kernels=("level1/1_",),
        levels=(str(LEVELS),),
        kernelbench=str(FIXTURE_KB),
        shapes="kernelbench",
        cwd=str(tmp_path),
        **options,
    )
    (plan,) = prepare.plan(spec, None)
    return plan


def _sized(flops: int | None = 24576, inputs=("32x48xf32", "48x16xf32")) -> Sized:
    return Sized(
        inputs=list(inputs),
        input_bytes=[6144, 3072],
        output_bytes=2048,
        param_bytes=0,
        flops=flops,
    )


def test_the_levels_entry_says_nothing_about_shapes_until_sized(tmp_path):
    plan = _plan(tmp_path)
    job = plan.job
    assert job.shapes == "kernelbench" and job.sized is None
    # the problem's get_inputs() and get_init_inputs(); no output shape to check, no gflops
    assert (job.inputs, job.init_args, job.outputs) == (None, None, None)
    assert plan.entry.gflops is None
    assert plan.memory == limits.WORKER_BASE_BYTES  # admitted to be sized as an unknown
    assert scheduler.needs_sizing(plan)

    sized = scheduler.sized(plan, _sized())
    assert not scheduler.needs_sizing(sized)
    assert sized.job.sized == _sized() and sized.job.inputs is None
    assert sized.entry.gflops == pytest.approx(24576 / 1e9)  # kbd's count, not the entry's 1000
    assert sized.memory == limits.WORKER_BASE_BYTES + 2 * (6144 + 3072) + 2 * 2048
    # uncounted FLOPs: no GFLOPS at all
    assert scheduler.sized(plan, _sized(flops=None)).entry.gflops is None


def test_the_smoke_test_rule_for_heavy_kernels_follows_the_flops_sizing_counts(tmp_path):
    plan = _plan(tmp_path, smoke_test=True)
    assert plan.job.opt_level == 0  # the entry's gflops of 1000 would have made it -O3
    assert scheduler.sized(plan, _sized(flops=10**6)).job.opt_level == 0
    assert scheduler.sized(plan, _sized(flops=30 * 10**9)).job.opt_level == 3
    # where FLOPs decide nothing, nothing is left to decide
    assert _plan(tmp_path).job.heavy_opt_level is None


def test_cache_keys_include_the_shapes_sizing_found(tmp_path):
    plan = _plan(tmp_path)
    at = scheduler.sized(plan, _sized())
    other = scheduler.sized(plan, _sized(inputs=("64x48xf32", "48x16xf32")))
    recount = scheduler.sized(plan, msgspec.structs.replace(_sized(), flops=1, note="x"))
    for cache in ("import_cache", "compile_cache"):
        keys = [getattr(p.job, cache).key for p in (plan, at, other, recount)]
        assert keys[1] != keys[0] and keys[2] != keys[1]  # other shapes, other entries
        assert keys[3] == keys[1]  # the same shapes: the same entry


def test_no_tuned_configuration_applies_at_a_problems_own_shapes(tmp_path):
    """Tuned configurations are keyed by input shapes, which a kernel at its own shapes has
    none of when its pipeline is chosen: with some adopted (for whatever task), the finder
    gives it the schedule's defaults, as it gives a task no configuration matches."""
    options = SweepSpec(levels=(str(LEVELS),), kernelbench=str(FIXTURE_KB), cwd=str(tmp_path))
    entry = catalog.load([LEVELS])[0]  # level1/1_matmul
    chooser = pipelines.Chooser(options, prepare.SCHEDULES_DIR, {"a-task": {"reg_m": 4}}, 1)
    path = chooser.descriptor_for(msgspec.structs.replace(entry, family="matmul"))
    if path is None or chooser.space_of(path) is None:
        pytest.skip("no tunable matmul schedule for this CPU")
    own = msgspec.structs.replace(catalog.own_shapes(entry), family="matmul")
    assert chooser.task(own, path) is None
    chosen = chooser.choose(own)
    assert chosen.name == str(path.relative_to(prepare.SCHEDULES_DIR))  # no "(tuned)"


def test_a_sized_plan_too_big_for_the_budget_is_skipped_with_its_shapes(tmp_path):
    plan = scheduler.sized(_plan(tmp_path, mem_limit=None), _sized())
    reason = scheduler.too_big(plan, budget=1 << 20)
    record = scheduler.skipped(plan, reason)
    assert record.message == (
        f"needs about {limits.format_size(plan.memory)} for inputs 32x48xf32, 48x16xf32, "
        "more than the memory budget 1.0 MiB"
    )
    assert record.shapes == "kernelbench" and record.inputs == ["32x48xf32", "48x16xf32"]


# --- the worker side: sizing on the meta device -----------------------------------------------

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, 8)
        {init}

    def forward(self, x, scale):
        {forward}
        return self.linear(x) * scale


def get_inputs():
    {inputs}
    return [torch.rand(4096, 16), 3]


def get_init_inputs():
    return [16]
"""


def _size(tmp_path: Path, dtype: str = "f32", **parts) -> Sized:
    from kbd.worker import ingress, sizing

    code = {"init": "pass", "forward": "pass", "inputs": "pass", **parts}
    text = PROBLEM.format(**code)
    path = tmp_path / "problem.py"
    problem = ingress.load_problem(str(path), text)
    return sizing.size(problem, dtype)


def test_sizing_measures_on_the_meta_device(tmp_path):
    # 4 TiB that get_inputs() only makes on the meta device (made for real, it would raise)
    sized = _size(tmp_path, inputs="assert torch.rand(1 << 20, 1 << 20).device.type == 'meta'")
    assert sized.inputs == ["4096x16xf32", "3"]
    assert sized.input_bytes == [4096 * 16 * 4, 0]
    assert sized.output_bytes == 4096 * 8 * 4
    assert sized.param_bytes == (16 * 8 + 8) * 4
    assert sized.flops == 2 * 4096 * 16 * 8  # torch's FLOP counter: the matmul
    assert sized.note == ""
    half = _size(tmp_path, dtype="bf16")  # as the job casts floating inputs and the model
    assert half.inputs == ["4096x16xbf16", "3"] and half.param_bytes == (16 * 8 + 8) * 2


def test_sizing_falls_back_where_the_meta_device_cannot_go(tmp_path):
    # get_inputs() that reads a value: called for real, under the worker's cap
    sized = _size(tmp_path, inputs="torch.randint(1, 5, ()).item()")
    assert sized.inputs == ["4096x16xf32", "3"] and "get_inputs() called for real" in sized.note
    # a constructor that reads a weight: built on the CPU, then measured on meta
    sized = _size(tmp_path, init="float(self.linear.weight.sum().item())")
    assert sized.param_bytes == (16 * 8 + 8) * 4 and "model built on the CPU" in sized.note
    # a forward that reads a value: outputs and FLOPs unknown (the estimate assumes the largest
    # input as output; the record has no GFLOPS)
    sized = _size(tmp_path, forward="x = x * float(x.sum().item() > 0)")
    assert (sized.output_bytes, sized.flops) == (None, None)
    assert "outputs and FLOPs unknown" in sized.note


def test_the_job_refuses_inputs_other_than_those_sized():
    import torch

    from kbd.worker import sizing

    sizing.check_inputs([torch.zeros(32, 48), 2.5], _sized(inputs=("32x48xf32", "2.5")))
    with pytest.raises(ValueError, match=r"get_inputs\(\) made 64x48xf32, 2.5; sizing it had"):
        sizing.check_inputs([torch.zeros(64, 48), 2.5], _sized(inputs=("32x48xf32", "2.5")))
