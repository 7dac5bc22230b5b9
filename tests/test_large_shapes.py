"""Kernels that pass at small shapes also pass at large ones (level 1 at bench shapes): what only
large shapes expose, on fixture kernels (tests/fixtures/large-shapes.yaml).

- Buffers freed at the end of the function: a cumsum (15 steps of shifted adds) held all 16 of
  its buffers; with `--mem-limit 1GiB` it died (SIGSEGV, a failed allocation), freed after last
  use it passes.
- Stack buffers inside loops: the matvec schedule's reduction loop allocated 576 bytes of stack
  per step, never freed; 128 rows of 262144 overflowed the stack (SIGSEGV).
- Long f32 sums: a mean of 2^24 elements summed in one sequence was 2.8% off eager (mismatch).
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIXTURE_KB, json_records, kbd

LEVELS = Path(__file__).resolve().parent / "fixtures" / "large-shapes.yaml"
MATVEC = Path(__file__).resolve().parent.parent / "schedules" / "x86_64" / "matvec" / "f32.yaml"


def run(*args: str, cwd: Path) -> dict[str, dict]:
    common = ["--kernelbench", str(FIXTURE_KB), "--levels", str(LEVELS), "-j", "1", "--json"]
    result = kbd("run", *common, *args, cwd=cwd)
    records = json_records(result.stdout)
    assert records, result.stderr
    return records


def test_buffers_are_freed_after_last_use_and_long_sums_are_accurate(tmp_path):
    records = run(
        "level1/6_", "level1/7_", "--schedules", "scalar", "-O", "0", "--mem-limit", "1GiB",
        cwd=tmp_path,
    )  # fmt: skip
    cumsum, mse = records["level1/6_cumsum"], records["level1/7_mse_loss"]
    assert cumsum["outcome"] == "pass", cumsum["message"]
    assert mse["outcome"] == "pass", mse["message"]
    assert mse["max_rel_error"] < 1e-4  # one sequential f32 sum: 2.8e-2


def test_a_family_schedule_keeps_its_stack_bounded_over_a_long_loop(tmp_path):
    records = run("level1/1_", "--pipeline", str(MATVEC), cwd=tmp_path)
    assert records["level1/1_matmul"]["outcome"] == "pass", records["level1/1_matmul"]["message"]
