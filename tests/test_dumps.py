"""Seeing inside a pipeline: --print-* into a file or folder, --object-file, --dump-assembly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kbd.engine import dumps
from kbd.plan import spec
from kbd.plan.spec import SweepSpec
from kbd.shared.errors import InputError
from tests.conftest import fixture_args, json_records, kbd

ET_REL = 1  # ELF e_type of a relocatable object


@pytest.mark.skipif(dumps.disassembler() is None, reason="needs objdump or llvm-objdump")
def test_print_options_object_file_and_assembly(tmp_path):
    args = fixture_args(
        "level1/1_",
        "--json",
        "--log-dir",
        "logs",
        "--print-mlir-after-all",
        "--print-optimized-module",
        "--print-to",
        "ir.mlir",
        "--dump-assembly",
    )
    result = kbd("run", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    record = json_records(result.stdout)["level1/1_matmul"]
    assert record["outcome"] == "pass" and record["bundle"] is None
    logs = tmp_path / "logs"
    assert record["dumps"] == {
        "ir": str(tmp_path / "ir.mlir"),
        "object": "logs/level1__1_matmul.o",
        "assembly": "logs/level1__1_matmul.s",
    }
    ir = (tmp_path / "ir.mlir").read_text()
    assert ir.count("// -----// IR Dump After ") >= 10  # every pass of the scalar pipeline
    assert "IR Dump After ConvertLinalgToLoopsPass" in ir
    assert "// -----// Optimized module: level1/1_matmul //----- //" in ir
    assert "llvm.func @main" in ir.split("Optimized module")[1]
    assert "IR Dump After" not in (logs / "level1__1_matmul.log").read_text()
    obj = (logs / "level1__1_matmul.o").read_bytes()
    assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[16:18], "little") == ET_REL
    assembly = (logs / "level1__1_matmul.s").read_text()
    assert "<main>:" in assembly and "<_mlir_ciface_main>:" in assembly


def _options(tmp_path: Path, print_to: str) -> SweepSpec:
    return SweepSpec(print_original_module=True, print_to=str(tmp_path / print_to))


def test_print_to_names_a_file_for_one_kernel_and_a_folder_for_several(tmp_path):
    one = dumps.inspect_for(_options(tmp_path, "out.mlir"), "level1/1_matmul", single=True)
    assert one.print_to == str(tmp_path / "out.mlir") and one.print_original
    several = dumps.inspect_for(_options(tmp_path, "out"), "level1/1_matmul [compile]", False)
    assert several.print_to == str(tmp_path / "out" / "level1__1_matmul[compile].mlir")
    (tmp_path / "dir").mkdir()
    existing = dumps.inspect_for(_options(tmp_path, "dir"), "level1/1_matmul", single=True)
    assert existing.print_to == str(tmp_path / "dir" / "level1__1_matmul.mlir")
    (tmp_path / "file.mlir").write_text("")
    with pytest.raises(InputError, match="is a file, but several kernels"):
        dumps.inspect_for(_options(tmp_path, "file.mlir"), "level1/1_matmul", single=False)


def test_print_to_without_a_print_option_is_a_usage_error(tmp_path):
    result = kbd("run", *fixture_args("level1/1_", "--print-to", "x.mlir"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "kbd: error: --print-to needs --print-mlir-after-all, --print-original-module or "
        "--print-optimized-module"
    )


def test_dump_assembly_without_a_disassembler_is_a_usage_error(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no objdump, no llvm-objdump
    result = kbd("run", *fixture_args("level1/1_", "--dump-assembly"), cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert "--dump-assembly" in result.stderr and "objdump" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_stored_spec_keeps_the_options_for_resume(tmp_path):
    options = SweepSpec(
        print_mlir_after_all=True,
        print_to=str(tmp_path / "ir") + "/",
        object_file=True,
        dump_assembly=True,
    )
    assert spec.decode(spec.encode(options), "test") == options
