"""kbd's identity: a hash of its code and the versions of the tools it drives.

Two kbd processes that share work must have the same identity. A daemon serves only clients of
its own (after kbd's code changes, with a `git pull` or an edit, the old daemon would otherwise
run old code); a cluster head uses only agents of its own; a reproducer bundle records the one
that wrote it, and the compile cache keys its entries by the code hash. Computing it reads
kbd's source files (a few milliseconds) and the names of installed packages' metadata folders;
it never imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import sys
from pathlib import Path

import msgspec

KBD_DIR = Path(__file__).resolve().parent.parent  # the kbd package


class Identity(msgspec.Struct, frozen=True):
    """What makes two kbd processes interchangeable: the same code on the same tools."""

    code_hash: str  # code_hash()
    python: str  # the interpreter's version, e.g. "3.11.7"
    torch: str  # an installed distribution's version, or "missing"
    torch_mlir: str
    executable: str = ""  # sys.executable; "" from a kbd that did not send it


# How each field is named in a phrase: as itself ("code hash: daemon 1234…, this kbd 5678…") and
# as the version of something ("kbd 1234… there, 5678… here").
_NAMES = {
    "code_hash": ("code hash", "kbd"),
    "python": ("python", "python"),
    "torch": ("torch", "torch"),
    "torch_mlir": ("torch-mlir", "torch-mlir"),
    "executable": ("interpreter", "interpreter"),
}


@functools.cache
def current() -> Identity:
    """This process's identity."""
    return Identity(
        code_hash=code_hash(),
        python=".".join(map(str, sys.version_info[:3])),
        torch=_version("torch"),
        torch_mlir=_version("torch-mlir"),
        executable=sys.executable,
    )


def code_hash() -> str:
    """sha256 over kbd/**/*.py, each file's path relative to the package and its contents; the
    first 16 hex digits. The same code hashes the same wherever it lies (a checkout, a copy,
    site-packages on another machine)."""
    digest = hashlib.sha256()
    for path in sorted(KBD_DIR.rglob("*.py")):
        digest.update(str(path.relative_to(KBD_DIR)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def differences(
    theirs: Identity, ours: Identity, phrase: str, *, across_machines: bool = False
) -> list[str]:
    """One phrase per field that differs: `phrase` formatted with the field's `label` ("code
    hash", "python", "torch", "torch-mlir", "interpreter"), the `tool` it is the version of
    ("kbd" for the code hash, otherwise the label) and the two values, `theirs` and `ours`;
    e.g. "{label}: daemon {theirs}, this kbd {ours}".

    Across machines the interpreter's path does not count, nor Python's patch level (3.11.2
    there matches 3.11.7 here). A field one side does not know (empty: sent by a kbd before the
    field existed) is not compared.
    """
    phrases = []
    for field, (label, tool) in _NAMES.items():
        a, b = getattr(theirs, field), getattr(ours, field)
        if not a or not b or (across_machines and field == "executable"):
            continue
        if across_machines and field == "python":
            same = a.split(".")[:2] == b.split(".")[:2]
        else:
            same = a == b
        if not same:
            phrases.append(phrase.format(label=label, tool=tool, theirs=a, ours=b))
    return phrases


def _version(name: str) -> str:
    """The installed version of distribution `name`, from its `NAME-VERSION.dist-info` folder
    (the wheel standard names it so), or from importlib.metadata, which parses the metadata
    with the email package (some 30 ms of a client's start-up); "missing" when not installed."""
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
