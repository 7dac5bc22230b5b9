"""What must match between the head and an agent: kbd's code, torch, torch-mlir and Python.

No torch import: versions come from the installed distributions' metadata.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from importlib import metadata
from pathlib import Path

import kbd

CHECKED = ("kbd", "python", "torch", "torch-mlir")


@functools.cache
def local() -> dict[str, str]:
    """This process's versions: kbd as a hash of its source files, the others by version."""
    return {
        "kbd": code_hash(),
        "python": ".".join(map(str, sys.version_info[:2])),
        "torch": _version("torch"),
        "torch-mlir": _version("torch-mlir"),
    }


def code_hash() -> str:
    """sha256 over kbd's Python files (names and contents): any code difference shows."""
    root = Path(kbd.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def mismatches(theirs: dict[str, str], ours: dict[str, str]) -> list[str]:
    """One phrase per differing version, e.g. 'torch 2.12.0 there, 2.13.0 here'."""
    return [
        f"{name} {theirs.get(name, 'missing')} there, {ours.get(name, 'missing')} here"
        for name in CHECKED
        if theirs.get(name) != ours.get(name)
    ]


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"
