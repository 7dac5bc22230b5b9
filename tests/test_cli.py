"""The command line as a user meets it: help, bad input (exit 2), and the CI kernels."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import (
    FIXTURE_KB,
    FIXTURE_LEVELS,
    LIGHTHOUSE_FORM,
    LIGHTHOUSE_WARNING,
    ROOT,
    fixture_args,
    json_records,
    kbd,
    needs_kernelbench,
)


@pytest.mark.parametrize("command", [[], ["run"], ["sweep"], ["results"], ["sweeps"]])
def test_help_does_not_import_torch(command):
    code = (
        "import sys\n"
        "from kbd.cli import main\n"
        "try:\n"
        f"    main({[*command, '--help']!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'torch_mlir' not in sys.modules, 'torch_mlir imported'\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "usage: kbd" in result.stdout


def test_every_option_of_every_command_has_help():
    from kbd.cli import build_parser

    def commands(parser):
        yield parser
        for action in parser._actions:
            for sub in getattr(action, "choices", None) or {}:
                if isinstance(action.choices, dict):
                    yield from commands(action.choices[sub])

    undocumented = [
        f"{parser.prog} {action.option_strings or action.dest}"
        for parser in commands(build_parser())
        for action in parser._actions
        if not action.help and not isinstance(action.choices, dict)  # subcommands: own help
    ]
    assert undocumented == []


def test_missing_kernelbench(tmp_path):
    result = kbd("run", "--kernelbench", str(tmp_path / "nowhere"), "level1/", cwd=tmp_path)
    assert result.returncode == 2
    assert "git submodule update --init" in result.stderr
    assert "Traceback" not in result.stderr


def test_kernelbench_from_environment(tmp_path):
    env = {"KBD_KERNELBENCH": str(tmp_path / "nope"), "PATH": "/usr/bin:/bin"}
    result = kbd("run", "--levels", str(FIXTURE_LEVELS), "level1/1_", cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert "KBD_KERNELBENCH" in result.stderr


def test_unknown_kernel(tmp_path):
    result = kbd("run", *fixture_args("level7/"), cwd=tmp_path)
    assert result.returncode == 2
    assert "'level7/'" in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- kernel: level1/1_matmul.py\n  input_shapes: [4x4\n", "malformed YAML"),
        ("- kernel: level1/1_matmul.py\n  colour: red\n", "unknown field 'colour'"),
        ("- kernel: level1/1_matmul.py\n  input_shapes: [4x4]\n", "initializations"),
        ("- kernel: level1/404_nothing.py\n", "does not exist"),
        ("kernel: level1/1_matmul.py\n", "list of entries"),
    ],
)
def test_bad_levels_file(tmp_path, text, expected):
    levels = tmp_path / "bad.yaml"
    levels.write_text(text)
    result = kbd("run", "--kernelbench", str(FIXTURE_KB), "--levels", str(levels), cwd=tmp_path)
    assert result.returncode == 2
    assert str(levels) in result.stderr and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--mem-limit", "lots"], "--mem-limit"),
        (["--timeout", "0"], "--timeout"),
        (["-j", "0"], "--jobs"),
        (["--pipeline", "no-such.yaml"], "no-such.yaml"),
        (["--pipeline", "gen.py"], ".mlir"),
    ],
)
def test_bad_options(tmp_path, option, expected):
    result = kbd("run", *fixture_args("level1/1_", *option), cwd=tmp_path)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_failing_pass_is_an_error_in_its_phase(tmp_path):
    """Lowering to LLVM without bufferizing first fails in that pass, not in the supervisor."""
    result = kbd(
        "run", *fixture_args("level1/1_", "--json", "--pipeline", "llvm-lowering"), cwd=tmp_path
    )
    record = json_records(result.stdout)["level1/1_matmul"]
    assert record["outcome"] in ("error", "crash"), record
    assert record["phase"].startswith(("pipeline:", "jit")), record
    assert result.returncode == 1


@needs_kernelbench
def test_ci_kernels_pass_on_real_kernelbench(tmp_path):
    result = kbd("run", "--levels", str(ROOT / "levels" / "ci.yaml"), "--json", cwd=tmp_path)
    records = json_records(result.stdout)
    assert len(records) == 5
    assert {r["outcome"] for r in records.values()} == {"pass"}, result.stdout
    assert result.returncode == 0


def test_a_levels_file_of_lighthouses_form_runs_and_shows_its_warning(tmp_path):
    """Every kernel of the lighthouse-form fixture passes; the one with a `warning` has it
    printed right above its line (plain output, in this process), again by `kbd results`, and
    in its JSON record."""
    levels = ("--kernelbench", str(FIXTURE_KB), "--levels", str(LIGHTHOUSE_FORM))
    swept = kbd("sweep", *levels, "--no-daemon", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    assert "4 kernels: 4 pass" in swept.stdout
    lines = swept.stderr.splitlines()
    assert lines.count(LIGHTHOUSE_WARNING) == 1
    assert sum(line.startswith("WARNING") for line in lines) == 1
    assert lines[lines.index(LIGHTHOUSE_WARNING) + 1].startswith("PASS     level1/7_mse_loss ")
    stored = kbd("results", cwd=tmp_path).stdout.splitlines()
    assert stored[stored.index(LIGHTHOUSE_WARNING) + 1].startswith("PASS     level1/7_mse_loss ")
    records = json_records(kbd("results", "--json", cwd=tmp_path).stdout)
    assert {k: r["warning"] for k, r in records.items()} == {
        "level1/1_matmul": None,
        "level1/2_relu_scale": None,
        "level1/7_mse_loss": LIGHTHOUSE_WARNING.removeprefix("WARNING: "),
        "level1/9_linear_relu": None,
    }


def test_kernels_that_cannot_fit_the_budget_are_skipped(tmp_path):
    result = kbd(
        "run", *fixture_args("level1/1_", "--json", "--mem-budget", "100MiB"), cwd=tmp_path
    )
    record = json_records(result.stdout)["level1/1_matmul"]
    assert (record["outcome"], record["phase"]) == ("skipped", "schedule")
    assert "needs about" in record["message"] and "100.0 MiB" in record["message"]
    assert result.returncode == 0
    # nothing could start, so no worker template was started either (its log would be there)
    assert list((tmp_path / ".kbd" / "logs").glob("*/template.log")) == []


@pytest.fixture(scope="module")
def plain_sweep(tmp_path_factory) -> subprocess.CompletedProcess:
    """`kbd sweep` without --cluster, through kbd.cli.main in a process of its own, with a user
    pipeline that has a transform script; exits 1 if anything imported ray."""
    selection = fixture_args("level1/1_", "--json", "--pipeline", "tiled-lowering")
    code = (
        "import sys\n"
        "from kbd.cli import main\n"
        f"code = main(['sweep', *{selection!r}])\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
        "sys.exit(code)\n"
    )
    cwd = tmp_path_factory.mktemp("plain")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)


def test_a_plain_sweep_never_imports_ray(plain_sweep):
    """Without --cluster nothing imports ray, installed or not (the `ray` extra is optional)."""
    assert "ray imported" not in plain_sweep.stderr
    assert plain_sweep.returncode == 0, plain_sweep.stderr


def test_pipeline_override_with_transform(plain_sweep):
    """A user pipeline with a transform script tiles the matmul and still matches eager."""
    record = json_records(plain_sweep.stdout)["level1/1_matmul"]
    assert record["outcome"] == "pass", record
    assert record["pipeline"] == "tiled-lowering", record


def test_cluster_without_ray_installed(tmp_path):
    """`--cluster` without the `ray` extra: one line saying what to install, nothing recorded."""
    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # as if Ray were not installed\n"
        "from kbd.cli import main\n"
        f"sys.exit(main(['sweep', *{fixture_args('level1/1_', '--cluster', 'auto')!r}]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'kbd[ray]'" in result.stderr
    assert "no sweep recorded yet" in kbd("results", cwd=tmp_path).stderr


def test_mem_limit_below_a_workers_base_need_is_a_usage_error(tmp_path):
    result = kbd("run", *fixture_args("level1/1_", "--mem-limit", "1KiB"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "kbd: error: --mem-limit 1.0 KiB is below the 512.0 MiB a worker needs before it runs "
        "anything (torch and torch-mlir are loaded); use 'none' for no cap\n"
    )


def test_a_levels_entry_naming_no_family_gets_its_family_at_run_time(tmp_path):
    """The fixture levels file names no family: each worker finds its kernel's family in the
    exported graph and runs that family's schedule; the record says so, and says why when the
    scalar pipeline stays (a determinant: no family)."""
    selection = ["level1/1_", "level1/3_", "level1/5_", "--json", "--feature", "avx512f"]
    result = kbd("run", *fixture_args(*selection, "--target", "x86_64"), cwd=tmp_path)
    records = json_records(result.stdout)
    assert {r["outcome"] for r in records.values()} == {"pass"}, result.stderr
    assert records["level1/1_matmul"]["pipeline"] == (
        "x86_64/avx512f/matmul/f32.yaml (matmul, family found at run time)"
    )
    for kernel in ["level1/3_sum_reduction", "level1/5_cross_entropy"]:  # a loss is a reduction
        assert records[kernel]["pipeline"] == (
            "x86_64/reduction/f32.yaml (reduction, family found at run time)"
        )
    levels = str(FIXTURE_LEVELS.parent / "dtypes.yaml")
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", levels, "level8/2_", "--json"]
    result = kbd("run", *args, "--target", "x86_64", cwd=tmp_path)
    (record,) = json_records(result.stdout).values()
    assert record["outcome"] == "pass", result.stderr
    assert record["pipeline"] == "scalar-lowering.yaml (no family found at run time)"
    # a smoke test runs the scalar pipeline and looks for no family
    smoke = kbd("sweep", "--smoke-test", *fixture_args(*selection), cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stderr
    pipelines = {r["pipeline"] for r in json_records(smoke.stdout).values()}
    assert pipelines == {"scalar-lowering.yaml"}
