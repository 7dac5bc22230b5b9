"""SweepSpec: one typed, validated specification of a run or sweep, stored for --resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbd.cli import build_parser
from kbd.plan import spec
from kbd.plan.spec import Shard, SweepSpec
from kbd.shared.errors import InputError


def _from(argv: list[str], cwd: Path) -> SweepSpec:
    return spec.from_args(build_parser().parse_args(argv), cwd)


def test_command_line_becomes_an_absolute_typed_spec(tmp_path):
    options = _from(
        ["sweep", "level1/", "--levels", "l.yaml", "--kernelbench", "kb", "-j", "2",
         "--mem-limit", "2GiB", "--mem-budget", "8GiB", "--shard", "2/3", "--smoke-test"],
        tmp_path,
    )  # fmt: skip
    assert options.kernels == ("level1/",)
    assert options.levels == (str(tmp_path / "l.yaml"),)
    assert options.kernelbench == str(tmp_path / "kb")
    assert (options.jobs, options.mem_limit, options.mem_budget) == (2, 2 << 30, 8 << 30)
    assert options.shard == Shard(2, 3)
    assert options.smoke_test and options.cwd == str(tmp_path)


def test_defaults_and_no_memory_cap(tmp_path):
    options = _from(["run", "--mem-limit", "none"], tmp_path)
    assert options.mem_limit is None and options.mem_budget is None and options.jobs is None
    assert _from(["run"], tmp_path).mem_limit == 4 << 30


def test_benchmarking_raises_the_default_memory_cap_but_not_a_given_one(tmp_path):
    # the timed sides' outputs and eager's temporaries come on top of the run's buffers
    assert _from(["run", "--benchmark"], tmp_path).mem_limit == 8 << 30
    assert _from(["tune", "level1/"], tmp_path).mem_limit == 8 << 30
    assert _from(["run", "--benchmark", "--mem-limit", "3GiB"], tmp_path).mem_limit == 3 << 30
    assert _from(["run", "--benchmark", "--mem-limit", "none"], tmp_path).mem_limit is None


@pytest.mark.parametrize(
    ("argv", "light", "heavy"),
    [(["run"], 2, 2), (["sweep"], 2, 2), (["sweep", "--smoke-test"], 0, 3),
     (["run", "--benchmark"], 3, 3), (["sweep", "--smoke-test", "--benchmark"], 3, 3),
     (["sweep", "--smoke-test", "-O", "2"], 2, 2), (["run", "-O", "1"], 1, 1),
     (["run", "--benchmark", "-O", "1"], 1, 1), (["sweep", "--smoke-test", "-O", "0"], 0, 0),
     (["sweep", "--smoke-test", "--schedules", "family"], 2, 2)],
)  # fmt: skip
def test_the_jit_optimises_fully_only_what_is_timed_or_heavy(tmp_path, argv, light, heavy):
    options = _from(argv, tmp_path)
    assert options.opt_level_for(None) == options.opt_level_for(0.2) == light
    assert options.opt_level_for(spec.SMOKE_HEAVY_GFLOPS) == options.opt_level_for(40.0) == heavy


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-j", "0"], "-j/--jobs must be at least 1, got 0"),
        (["--timeout", "0"], "--timeout must be positive"),
        (["--tolerance", "0.5", "--max-tolerance", "0.1"], "at most --max-tolerance"),
        (["--mem-limit", "lots"], "--mem-limit: 'lots' is not a size"),
    ],
)
def test_bad_options_are_input_errors(tmp_path, argv, expected):
    with pytest.raises(InputError, match=expected):
        _from(["run", *argv], tmp_path)


@pytest.mark.parametrize(("text", "expected"), [("3/2", "between 1 and N"), ("x", "I/N")])
def test_bad_shards(text, expected):
    with pytest.raises(InputError, match=expected):
        spec.parse_shard(text)


def test_stored_spec_round_trips_and_validates():
    options = SweepSpec(kernels=("level2/",), timeout=30.0, shard=Shard(1, 4), mem_limit=None)
    assert spec.decode(spec.encode(options), "sweep 1") == options
    with pytest.raises(InputError, match="sweep 7: stored options are not valid"):
        spec.decode('{"timeout": "soon"}', "sweep 7")
    with pytest.raises(InputError, match="sweep 7: stored options are not JSON"):
        spec.decode("{", "sweep 7")


def test_target_and_features_choose_the_family_schedule(tmp_path):
    from kbd.engine.prepare import SCHEDULES_DIR
    from kbd.plan import pipelines
    from kbd.plan.catalog import Entry

    entry = Entry("level1/1_matmul.py", "l.yaml", None, None, None, None, "matmul", "f32", None)

    def schedule(argv: list[str]) -> str:
        return pipelines.choose(entry, _from(["sweep", *argv], tmp_path), SCHEDULES_DIR).name

    assert schedule(["--target", "x86_64", "--feature", "avx512f"]) == (
        "x86_64/avx512f/matmul/f32.yaml"
    )
    assert schedule(["--target", "x86_64", "--feature", "none", "--feature", "avx512f"]) == (
        "x86_64/avx512f/matmul/f32.yaml"
    )
    assert schedule(["--target", "x86_64", "--feature", "none"]) == "x86_64/matmul/f32.yaml"
    assert schedule(["--target", "aarch64", "--feature", "neon"]) == (
        "scalar-lowering.yaml (no matmul f32 schedule for aarch64 (neon))"
    )
    with pytest.raises(InputError, match="--target/--feature 'avx 2'"):
        _from(["run", "--feature", "avx 2"], tmp_path)


def test_family_schedules_are_used_unless_smoke_testing_or_told(tmp_path):
    from kbd.engine.prepare import SCHEDULES_DIR
    from kbd.plan import pipelines
    from kbd.plan.catalog import Entry

    generated = Entry("k.py", "l.yaml", None, None, None, None, None, "f32", None, "matmul")
    hand_set = Entry(
        "k.py", "l.yaml", None, None, None, None, "element_wise", "f32", None, "matmul"
    )
    plain = Entry("k.py", "l.yaml", None, None, None, None, None, "f32", None)
    found = "x86_64/avx512f/matmul/f32.yaml"

    def chosen(entry: Entry, *argv: str) -> str:
        options = _from([*argv, "--target", "x86_64", "--feature", "avx512f"], tmp_path)
        return pipelines.choose(entry, options, SCHEDULES_DIR).name

    assert chosen(generated, "run") == chosen(generated, "sweep") == found
    assert chosen(generated, "sweep", "--benchmark") == found
    assert chosen(generated, "sweep", "--smoke-test", "--schedules", "family") == found
    assert chosen(generated, "sweep", "--smoke-test") == (
        "scalar-lowering.yaml (family schedules off: --smoke-test)"
    )
    assert chosen(generated, "run", "--schedules", "scalar") == (
        "scalar-lowering.yaml (family schedules off: --schedules scalar)"
    )
    assert chosen(hand_set, "run") == "x86_64/element_wise/f32.yaml"  # pipeline beats family
    assert chosen(plain, "run") == "scalar-lowering.yaml"
    # A family schedule is all a kernel runs: nothing of the scalar pipeline is added after it.
    stages = pipelines.choose(generated, _from(["run"], tmp_path), SCHEDULES_DIR).stages
    assert {Path(s.source).name for s in stages}.isdisjoint({"scalar-lowering.yaml"})


def test_an_entry_naming_no_family_carries_every_family_schedule_for_the_worker(tmp_path):
    from kbd.engine.prepare import SCHEDULES_DIR
    from kbd.plan import pipelines
    from kbd.plan.catalog import Entry

    plain = Entry("k.py", "l.yaml", None, None, None, None, None, "f32", None)
    generated = Entry("k.py", "l.yaml", None, None, None, None, None, "f32", None, "softmax")

    def chosen(entry: Entry, *argv: str, arch: str = "x86_64") -> pipelines.Chosen:
        options = _from([*argv, "--target", arch, "--feature", "avx512f"], tmp_path)
        return pipelines.choose(entry, options, SCHEDULES_DIR)

    families = chosen(plain, "run").families
    on_disk = {p.parent.name for p in (SCHEDULES_DIR / "x86_64").glob("**/f32.yaml")}
    assert set(families) == on_disk and {"matmul", "softmax", "element_wise"} <= on_disk
    matmul = families["matmul"]
    assert matmul.name == "x86_64/avx512f/matmul/f32.yaml (matmul, family found at run time)"
    assert matmul.stages == chosen(Entry("k.py", *[None] * 5, "matmul", "f32", None), "run").stages
    assert families["softmax"].name.startswith("x86_64/softmax/f32.yaml ")
    # an entry with a family, and a smoke test, leave nothing to choose at run time
    assert chosen(generated, "run").families == {}
    assert chosen(plain, "sweep", "--smoke-test").families == {}
    assert chosen(plain, "run", arch="aarch64").families == {}
