"""The CPU a pipeline is chosen and compiled for: architecture and feature flags.

Feature names are those of /proc/cpuinfo (`avx2`, `avx512f`, ...), which are also the names of
the feature directories under `schedules/<arch>/`. `LLVM_FEATURES` says which LLVM target
features a schedule written for one of them may use, so code for a CPU the host is not can still
be compiled (and written out as an object), though not run.
"""

from __future__ import annotations

LLVM_FEATURES: dict[str, tuple[str, ...]] = {
    "avx2": ("+avx", "+avx2", "+fma", "+f16c"),
    "avx512f": (
        "+avx",
        "+avx2",
        "+fma",
        "+f16c",
        "+avx512f",
        "+avx512vl",
        "+avx512bw",
        "+avx512dq",
    ),
}
