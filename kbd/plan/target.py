"""The CPU a pipeline is chosen and compiled for: architecture and feature flags.

Feature names are those of /proc/cpuinfo (`avx2`, `avx512f`, ...), which are also the names of
the feature directories under `schedules/<arch>/`. `RANKING` is the order in which the finder
tries the host's features: wider and newer first, so a CPU with AVX-512 gets its AVX-512
schedules even though /proc/cpuinfo lists `avx2` before `avx512f`. `LLVM_FEATURES` says which
LLVM target features a schedule written for one of them may use, so code for a CPU the host is
not can still be compiled (and written out as an object), though not run.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from pathlib import Path

import msgspec

# Feature directories the finder picks by itself, best first; after them comes the
# architecture's generic schedule (schedules/<arch>/<family>/). A feature directory not ranked
# here is only used when named with --feature.
# bf16 feature directories come first: they only hold bf16 schedules (a family's f32.yaml is
# still found under avx512f), and a CPU with them runs bf16 dot products natively.
RANKING: tuple[str, ...] = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")

_AVX512 = ("+avx", "+avx2", "+fma", "+f16c", "+avx512f", "+avx512vl", "+avx512bw", "+avx512dq")
LLVM_FEATURES: dict[str, tuple[str, ...]] = {
    "avx2": ("+avx", "+avx2", "+fma", "+f16c"),
    "avx512f": _AVX512,
    "avx512_bf16": (*_AVX512, "+avx512bf16"),
    "amx_bf16": (*_AVX512, "+avx512bf16", "+amx-tile", "+amx-bf16"),
}


def ranked(flags: Iterable[str]) -> list[str]:
    """The ranked features among a CPU's flags, best first (see RANKING)."""
    present = set(flags)
    return [feature for feature in RANKING if feature in present]


def cpu_model(flags: Iterable[str] = ()) -> str:
    """The CPU to name next to a figure: /proc/cpuinfo's model name with its family and model
    numbers (a VM may hide the marketing name), and those of `flags` the CPU has, e.g.
    'AMD EPYC (family 26 model 2, avx512f avx512_bf16)'."""
    fields = cpuinfo()
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    present = set(fields.get("flags", "").split())
    shown = [flag for flag in flags if flag in present]
    numbers = f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    return f"{name} ({numbers}{', ' + ' '.join(shown) if shown else ''})"


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    """The CPU a schedule is chosen and tuned for: what a tuning task key says of a machine.
    A cluster node reports its own (kbd.cluster.wire.NodeInfo), so that a task tuned there is
    keyed by that node's CPU, not by the head's."""

    arch: str  # platform.machine()
    flags: list[str]  # /proc/cpuinfo's feature flags
    cpu: str  # cpu_model()


def this_machine() -> Machine:
    """This machine's architecture, feature flags and CPU model."""
    fields = cpuinfo()
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return Machine(arch=platform.machine(), flags=flags, cpu=cpu_model())


def cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's fields for the first CPU (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields
