"""kbd's identity: a hash of its code and the versions of the tools it drives.

A daemon serves only clients with the same identity: after kbd's code changes (a `git pull`, an
edit), the old daemon would otherwise run old code. Computing it reads kbd's ~40 source files
(a few milliseconds) and the names of installed packages' metadata folders; it never imports
torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import sys
from pathlib import Path

from kbd.shared.protocol import Identity

KBD_DIR = Path(__file__).resolve().parent.parent


@functools.cache
def current() -> Identity:
    """This process's identity."""
    return Identity(
        code_hash=code_hash(),
        python=f"{sys.executable} {sys.version.split()[0]}",
        torch=_version("torch"),
        torch_mlir=_version("torch-mlir"),
    )


def code_hash() -> str:
    """sha256 over kbd/**/*.py (paths and contents) and pyproject.toml, first 16 hex digits."""
    digest = hashlib.sha256()
    files = sorted(KBD_DIR.rglob("*.py"))
    pyproject = KBD_DIR.parent / "pyproject.toml"
    if pyproject.exists():
        files.append(pyproject)
    for path in files:
        digest.update(str(path.relative_to(KBD_DIR.parent)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def differences(daemon: Identity, client: Identity) -> list[str]:
    """What differs, one phrase per field, e.g. "code hash: daemon 1234…, this kbd 5678…"."""
    names = {
        "code_hash": "code hash",
        "python": "python",
        "torch": "torch",
        "torch_mlir": "torch-mlir",
    }
    return [
        f"{label}: daemon {getattr(daemon, field)}, this kbd {getattr(client, field)}"
        for field, label in names.items()
        if getattr(daemon, field) != getattr(client, field)
    ]


def _version(name: str) -> str:
    """The installed version of distribution `name`, from its `NAME-VERSION.dist-info` folder
    (the wheel standard names it so), or from importlib.metadata, which parses the metadata
    with the email package (some 30 ms of a client's start-up)."""
    prefix = re.sub(r"[-_.]+", "_", name).lower() + "-"
    for folder in sys.path:
        with contextlib.suppress(OSError):
            for info in os.scandir(folder or "."):
                lowered = info.name.lower()
                if lowered.startswith(prefix) and lowered.endswith(".dist-info"):
                    return info.name[len(prefix) : -len(".dist-info")]
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"
