"""The `kbd levels` subcommands: check, generate, update-xfail."""

from __future__ import annotations

import argparse

from kbd.plan import schema
from kbd.plan.invocation import DEFAULT_DB
from kbd.plan.spec import DEFAULT_MEM_LIMIT
from kbd.shared.errors import InputError

_KERNELBENCH_HELP = (
    "KernelBench folder holding level1/, level2/, ... (default: $KBD_KERNELBENCH, "
    "then third_party/KernelBench/KernelBench)"
)


def add_parser(sub) -> None:
    """Add `kbd levels ...` to the `kbd` subcommands."""
    levels = sub.add_parser(
        "levels",
        help="check, generate and update the levels files",
        description="Tools for the levels files (levels/*.yaml, levels/bench/*.yaml).",
    )
    tools = levels.add_subparsers(dest="levels_command", metavar="TOOL", required=True)

    check = tools.add_parser(
        "check",
        help="validate every levels file (no torch, no KernelBench needed)",
        description="Validate every levels and overrides file, the generated files' layout and, "
        "when KernelBench is found, that every kernel exists and every problem has an entry. "
        "Exit 1 when a problem is found.",
    )
    check.add_argument("--kernelbench", metavar="DIR", help=_KERNELBENCH_HELP)
    check.add_argument("--levels-dir", metavar="DIR", help="levels folder (default: levels/)")

    gen = tools.add_parser(
        "generate",
        help="write levels files from KernelBench (one sandboxed worker per problem)",
        description="Measure every KernelBench problem of level1-3 in a sandboxed worker and "
        "write the levels files of a shape tier: KernelBench's own shapes when they fit the "
        "tier's budget, else reduced by halving size constants, and each problem's schedule "
        "family from the ops of its exported graph. Hand-set fields (pipeline, dtype, xfail) "
        "are kept; overrides.yaml of the tier's folder replaces fields.",
    )
    gen.add_argument(
        "--shapes",
        choices=tuple(schema.TIERS),
        default="smoke",
        help="smoke: levels/level*.yaml (64 MiB, 2e8 FLOP per kernel); bench: "
        "levels/bench/level*.yaml (1 GiB, 2e9 FLOP) (default %(default)s)",
    )
    gen.add_argument("--kernelbench", metavar="DIR", help=_KERNELBENCH_HELP)
    gen.add_argument("--levels-dir", metavar="DIR", help="levels folder (default: levels/)")
    gen.add_argument(
        "--only", nargs="+", metavar="PREFIX", help="regenerate only problems with these prefixes"
    )
    gen.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file would change"
    )
    gen.add_argument(
        "-j", "--jobs", type=int, default=1, metavar="N", help="workers (default %(default)s)"
    )
    gen.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="per-problem limit (default %(default)s)",
    )
    gen.add_argument(
        "--mem-limit",
        default=DEFAULT_MEM_LIMIT,
        metavar="SIZE",
        help="per-worker memory cap (default %(default)s)",
    )
    gen.add_argument("--log-dir", metavar="DIR", help="default .kbd/logs/levels-generate")

    xfail = tools.add_parser(
        "update-xfail",
        help="record expected failures from a stored sweep",
        description="Write each unexpected failure of a stored sweep (outcome, phase, first "
        "message line) as the kernel's `xfail`, and drop it from kernels that now pass.",
    )
    xfail.add_argument("sweep", nargs="?", type=int, help="sweep id (default: latest)")
    xfail.add_argument(
        "--db", metavar="PATH", default=DEFAULT_DB, help="results database (default %(default)s)"
    )
    xfail.add_argument(
        "--levels",
        action="append",
        default=[],
        metavar="FILE",
        help="levels file to update (repeatable; default: levels/level*.yaml)",
    )


def run(args: argparse.Namespace) -> int:
    if args.levels_command == "check":
        from kbd.levels import check

        return check.run(args)
    if args.levels_command == "generate":
        if args.jobs < 1:
            raise InputError(f"-j/--jobs must be at least 1, got {args.jobs}")
        if not args.timeout > 0:  # also NaN
            raise InputError(f"--timeout must be positive, got {args.timeout:g}")
        from kbd.levels import generate

        return generate.run(args)
    from kbd.levels import xfail

    return xfail.run(args)
