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
