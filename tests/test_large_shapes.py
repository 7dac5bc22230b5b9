"""Kernels that pass at small shapes also pass at large ones (level 1 at bench shapes): what only
large shapes expose, on fixture kernels (tests/fixtures/large-shapes.yaml), in one run with
`--mem-limit 1GiB` and `-O 0`.

- A large cumsum: decomposed into 15 steps of shifted adds, as kbd once did, it held all 16 of
  its buffers and died (SIGSEGV, a failed allocation) until buffers were freed after their last
  use; now one pass at import (kbd.worker.mlir.scans), it allocates nothing but its output.
- Stack buffers inside loops: the matvec schedule's reduction loop allocated 576 bytes of stack
  per step, never freed; 128 rows of 262144 overflowed the stack (SIGSEGV).
- Long f32 sums: a mean of 2^24 elements summed in one sequence was 2.8% off eager (mismatch).
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIXTURE_KB, json_records, kbd

LEVELS = Path(__file__).resolve().parent / "fixtures" / "large-shapes.yaml"


def test_large_shapes_pass(tmp_path):
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(LEVELS), "-j", "1", "--json"]
    result = kbd("run", *args, "-O", "0", "--mem-limit", "1GiB", cwd=tmp_path)
    records = json_records(result.stdout)
    assert len(records) == 3, result.stderr
    for name, record in records.items():
        assert record["outcome"] == "pass", f"{name}: {record['message']}"
    assert records["level1/1_matmul"]["pipeline"].endswith("matvec/f32.yaml")
    assert records["level1/7_mse_loss"]["max_rel_error"] < 1e-4  # one sequential sum: 2.8e-2
