"""What a levels file holds and how generated ones are laid out: one schema for every reader and
writer (the catalog, the generator, update-xfail and `kbd levels check`).

A generated file is a header comment, then one entry per problem in KernelBench order, one
`key: value` line per field in FIELDS order (values in YAML flow style), optionally preceded by
comment lines of its own (why its inputs were chosen by hand, or that it is over budget).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from kbd.shared.protocol import Budget

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
LEVELS_DIR = REPO_ROOT / "levels"
LEVELS = ("level1", "level2", "level3")

# Every field of an entry, in the order a generated file writes them.
FIELDS = (
    "kernel",
    "input_shapes",
    "initializations",
    "output_shape",
    "init_args",
    "gflops",
    "family",
    "pipeline",
    "dtype",
    "warning",
    "xfail",
)
# Written by the generator from measurement (`family`: the schedule family of the exported
# graph); every other field is hand-set and survives regeneration (`pipeline`, which overrides
# `family`, `dtype`, `warning`, `xfail`). `xfail` stays last: update-xfail appends it.
GENERATED = ("input_shapes", "initializations", "output_shape", "init_args", "gflops", "family")
HAND_SET = tuple(f for f in FIELDS if f != "kernel" and f not in GENERATED)
XFAIL_FIELDS = ("outcome", "phase", "message", "dtype")
# overrides.yaml may set these; `reason` is written as a comment above the entry.
OVERRIDE_FIELDS = (*GENERATED, "pipeline", "dtype", "reason")


@dataclass(frozen=True)
class Tier:
    """A set of generated levels files with one budget per kernel."""

    name: str
    subdir: str  # under levels/
    budget: Budget
    why: str  # one line for the header

    def directory(self, levels_dir: Path = LEVELS_DIR) -> Path:
        return levels_dir / self.subdir if self.subdir else levels_dir

    def header(self, level: str) -> str:
        size = self.budget.nbytes / 2**20
        size_text = f"{size / 1024:g} GiB" if size >= 1024 else f"{size:g} MiB"
        budget = f"{size_text} and {self.budget.flops:g} FLOP"
        why = "".join(f"# {line}\n" for line in self.why.splitlines())
        return (
            f"# {level} {self.name} shapes for kbd, written by `kbd levels generate"
            f"{'' if self.name == 'smoke' else ' --shapes ' + self.name}` from KernelBench.\n"
            f"{why}"
            f"# Budget per kernel: inputs + outputs + parameters <= {budget} per forward;\n"
            "# KernelBench's own shapes when they fit, else its size constants halved (batch,\n"
            "# then spatial, then features; kernel sizes, strides, groups and heads kept).\n"
            "# gflops: torch's FLOP counter, or one FLOP per element of the largest operand of\n"
            "# every op when it counts 0. family: the schedule family of the exported graph.\n"
            "# Hand edits: pipeline (replaces family), dtype and xfail here (kept on\n"
            "# regeneration); anything else in overrides.yaml of this folder.\n"
        )


TIERS = {
    "smoke": Tier(
        "smoke",
        "",
        Budget(nbytes=64 << 20, flops=2e8),
        "Smoke tests check correctness: the scalar pipeline runs each kernel in seconds.",
    ),
    "bench": Tier(
        "bench",
        "bench",
        Budget(nbytes=1 << 30, flops=2e9),
        "Benchmarks time kernels: large enough to time, small enough that the scalar pipeline\n"
        "(~0.5-1 GFLOP/s) keeps a sweep bounded.",
    ),
}


class Loader(yaml.SafeLoader):
    """YAML without YAML 1.1's hex, octal and sexagesimal integers: `0x10` is a shape string."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(0|[1-9][0-9_]*)$"), list("-+0123456789")
)


def flow(value) -> str:
    """A value as one line of YAML flow style."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


def dump(header: str, entries: list[dict], comments: dict[str, list[str]]) -> str:
    """A generated levels file: header, then each entry (its comment lines first)."""
    lines = [header]
    for entry in entries:
        lines.extend(f"# {c}" for c in comments.get(entry["kernel"], []))
        keys = [k for k in FIELDS if k in entry]
        for i, key in enumerate(keys):
            lines.append(f"{'- ' if i == 0 else '  '}{key}: {flow(entry[key])}")
    return "\n".join(lines) + "\n"


def parse(text: str) -> tuple[list[dict], dict[str, list[str]]]:
    """Raw entries and each entry's own comment lines (those right above its `- kernel:`)."""
    data = yaml.load(text, Loader=Loader) or []
    entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
    comments: dict[str, list[str]] = {}
    pending: list[str] = []
    for line in text.splitlines():
        if line.startswith("# "):
            pending.append(line.removeprefix("# "))
        elif line.startswith("- kernel: "):
            if pending:
                comments[line.removeprefix("- kernel: ").strip()] = pending
            pending = []
        else:
            pending = []  # the header (ends with a blank line) or a field line
    return entries, comments


def problem_number(kernel: str) -> int:
    """The leading number of `level1/12_Name.py` (KernelBench order)."""
    return int(Path(kernel).name.split("_")[0])
