"""Reproducer bundles and `kbd replay`, on fixture kernels whose pipeline stage fails: a transform
script that fails (level1/1_matmul), a pass option that does not exist (level1/2_relu_scale) and a
stage that segfaults (level1/4_conv2d: a transform script too deeply nested for MLIR's parser).
The three kernels run in one warm template; each replay is a real `kbd replay`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio
import pytest

from kbd.engine import bundles, prepare
from kbd.engine.scheduler import Hooks, run_plan
from kbd.engine.spawner import Spawner, template_env
from kbd.plan import spec
from tests.conftest import FIXTURE_KB, FIXTURE_LEVELS, ROOT, kbd

FAILING = ROOT / "tests" / "fixtures" / "schedules" / "failing.yaml"
TILE_ERROR = "error: too many tiles provided, expected at most 3 found 4"
MLIR_BYTECODE = b"ML\xefR"  # the magic number of MLIR bytecode
DEPTH = 500_000  # nesting that overflows the stack of MLIR's recursive-descent parser


def _deep_script(path: Path) -> Path:
    nested = "[" * DEPTH + "]" * DEPTH
    path.write_text(
        "module attributes {transform.with_named_sequence} {\n"
        "  transform.named_sequence @__transform_main(%root: !transform.any_op "
        f"{{transform.readonly, kbd.deep = {nested}}}) {{\n    transform.yield\n  }}\n}}\n"
    )
    return path


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """kernel -> record of the three failing kernels; logs and bundles under the returned dir."""
    cwd = tmp_path_factory.mktemp("bundles")
    deep = _deep_script(cwd / "deep.mlir")
    plans = []
    for kernels, pipeline in (
        (("level1/1_", "level1/2_"), (str(FAILING),)),
        (("level1/4_",), ("canonicalize", str(deep))),
    ):
        options = spec.SweepSpec(
            kernels=kernels,
            levels=(str(FIXTURE_LEVELS),),
            kernelbench=str(FIXTURE_KB),
            pipeline=pipeline,
            cwd=str(cwd),
            import_cache=False,
            print_original_module=True,  # into the log
        )
        plans += prepare.plan(options, None)
    cores = tuple(sorted(os.sched_getaffinity(0)))[:1]
    logs = cwd / "logs"

    async def run_all():
        async with Spawner.started(template_env(1), logs / "template.log") as spawner:
            return [
                await run_plan(spawner, p, cores, timeout=120, log_dir=logs, hooks=Hooks())
                for p in plans
            ]

    return {r.kernel: r for r in anyio.run(run_all)}, cwd


def test_a_failing_transform_script_writes_a_bundle(failed):
    records, _ = failed
    record = records["level1/1_matmul"]
    assert (record.outcome, record.phase, record.message) == (
        "error",
        "pipeline:failing-tile.mlir",
        TILE_ERROR,
    )
    bundle = Path(record.bundle)
    assert bundle.parent == Path(record.log).parent and bundle.name == "level1__1_matmul.bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["stage_number"] == 2 and manifest["stages"] == 3
    assert manifest["message"] == TILE_ERROR and manifest["opt_level"] == 2  # not timed: -O2
    assert manifest["identity"]["code_hash"] and manifest["kbd_version"]
    assert "tile_sizes [8, 8, 8, 8]" in (bundle / "stage.mlir").read_text()  # $tile resolved
    # the IR before stage 2: after canonicalize, still on tensors, nothing tiled
    assert manifest["input"] == "input.mlir"  # the worker lived to print it as text
    before = (bundle / "input.mlir").read_text()
    assert "linalg.matmul" in before and "scf.for" not in before
    assert "kbd replay" in (bundle / "README.txt").read_text()


def test_an_unknown_pass_option_writes_a_bundle_with_the_pass_pipeline(failed):
    records, _ = failed
    record = records["level1/2_relu_scale"]
    assert record.phase == "pipeline:convert-linalg-to-loops" and record.outcome == "error"
    assert "no-such-option" in record.message
    bundle = Path(record.bundle)
    assert (bundle / "pipeline.txt").read_text().strip() == (
        "builtin.module(convert-linalg-to-loops{no-such-option=1})"
    )
    assert json.loads((bundle / "manifest.json").read_text())["stage_number"] == 3


def test_a_segfault_inside_a_stage_still_gets_a_bundle(failed):
    records, _ = failed
    record = records["level1/4_conv2d"]
    assert (record.outcome, record.phase, record.signal) == (
        "crash",
        "pipeline:deep.mlir",
        "SIGSEGV",
    )
    bundle = Path(record.bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["signal"] == "SIGSEGV" and manifest["stage_number"] == 2
    # the worker died inside the stage: its IR is the bytecode snapshot it left
    assert manifest["input"] == "input.mlirbc" and not (bundle / "input.mlir").exists()
    assert (bundle / "input.mlirbc").read_bytes().startswith(MLIR_BYTECODE)


def test_the_print_options_write_into_the_log_by_default(failed):
    records, _ = failed
    log = Path(records["level1/1_matmul"].log).read_text()
    assert "// -----// Original module: level1/1_matmul //----- //" in log
    assert records["level1/1_matmul"].dumps == {"ir": records["level1/1_matmul"].log}


def _replay(bundle: str, cwd: Path, *extra: str):
    return kbd("replay", bundle, "--log-dir", str(cwd / "replay"), *extra, cwd=cwd)


def _line(stdout: str, which: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith(which))


def test_replay_reproduces_the_transform_error(failed):
    records, cwd = failed
    result = _replay(records["level1/1_matmul"].bundle, cwd)
    assert result.returncode == 1, result.stdout + result.stderr
    original, replayed = _line(result.stdout, "original"), _line(result.stdout, "replayed")
    assert original.split(None, 1)[1] == replayed.split(None, 1)[1]
    assert replayed.endswith(f"error    [pipeline:failing-tile.mlir]  {TILE_ERROR}")
    assert "the failure reproduces" in result.stdout


def test_replay_reproduces_a_crash(failed):
    records, cwd = failed
    result = _replay(records["level1/4_conv2d"].bundle, cwd)
    assert result.returncode == 1, result.stdout + result.stderr
    assert _line(result.stdout, "replayed").endswith(
        "crash    [pipeline:deep.mlir]  SIGSEGV: worker killed by SIGSEGV"
    )
    assert "the failure reproduces" in result.stdout


def test_replay_of_an_edited_bundle_that_now_passes_exits_0(failed):
    records, cwd = failed
    bundle = cwd / "edited.bundle"
    shutil.copytree(records["level1/2_relu_scale"].bundle, bundle)
    (bundle / "pipeline.txt").write_text("builtin.module(convert-linalg-to-loops)\n")
    result = _replay(str(bundle), cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _line(result.stdout, "replayed").startswith("replayed  pass")
    assert "the stage now passes" in result.stdout


@pytest.mark.parametrize("damage", ["missing", "no-manifest", "bad-manifest", "bad-pipeline"])
def test_a_bad_bundle_is_one_clear_error(failed, tmp_path, damage):
    records, _ = failed
    bundle = tmp_path / "b.bundle"
    shutil.copytree(records["level1/2_relu_scale"].bundle, bundle)
    if damage == "missing":
        bundle = tmp_path / "nowhere"
    elif damage == "no-manifest":
        (bundle / "manifest.json").unlink()
    elif damage == "bad-manifest":
        (bundle / "manifest.json").write_text('{"format": 1, "kernel": 3}')
    else:
        (bundle / "pipeline.txt").write_text("convert-linalg-to-loops\n")
    result = kbd("replay", str(bundle), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kbd: error: {bundle}"), result.stderr


def test_bundles_load_reads_the_files_not_the_manifest_copy(failed, tmp_path):
    records, _ = failed
    bundle = tmp_path / "b.bundle"
    shutil.copytree(records["level1/1_matmul"].bundle, bundle)
    script = (bundle / "stage.mlir").read_text().replace("[8, 8, 8, 8]", "[4, 4, 4, 4]")
    (bundle / "stage.mlir").write_text(script)
    loaded = bundles.load(bundle)
    assert loaded.stage.kind == "transform" and "[4, 4, 4, 4]" in loaded.stage.script
    assert loaded.module == (bundle / "input.mlir").read_bytes()
