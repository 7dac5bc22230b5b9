"""Outcomes, declared once: every way a kernel can end, with all its attributes.

Like lit's `ResultCode`, this table is the only place that says what an outcome means. The
`Outcome` type (on the wire, in records and in the store), the exit status, the order of counts and
summary rows, the JUnit mapping, the tolerance shown on a line, which outcomes a levels entry's
`xfail` may name, and how `kbd levels update-xfail` treats each outcome all derive from it. To add
an outcome, add a row (and its line in the README's outcome table, which a test compares).

This module is shared by both sides and imports nothing from kbd.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import msgspec


class OutcomeCode(msgspec.Struct, frozen=True, kw_only=True):
    """One outcome and its attributes."""

    name: str
    meaning: str  # one line for the README table and `--help`
    failure: bool  # the run fails (exit status 1) and the kernel counts as failed
    junit: Literal["passed", "failure", "skipped"]  # how a JUnit report shows it
    expectable: bool = False  # a levels entry's `xfail` may name it; update-xfail records it
    # An expected failure of this outcome matches on the message prefix too. False where the
    # message is not a stable fingerprint (where an allocation fails, how far a hang got).
    fingerprint_message: bool = True
    correct: bool = False  # the kernel's result was right: update-xfail drops its `xfail` key
    shows_tolerance: bool = False  # a report line shows the smallest passing tolerance
    # A verdict on the kernel. False for an infrastructure event (a lost cluster agent): the
    # kernel runs again, and `--resume` treats it as not finished.
    final: bool = True


# Display order: counts, summary rows and the README table follow the order of this tuple.
TABLE: tuple[OutcomeCode, ...] = (
    OutcomeCode(
        name="pass",
        meaning="matches eager within the tolerance",
        failure=False,
        junit="passed",
        correct=True,
        shows_tolerance=True,
    ),
    OutcomeCode(
        name="xfail",
        meaning="failed as its levels entry's `xfail` expects",
        failure=False,
        junit="skipped",
        shows_tolerance=True,
    ),
    OutcomeCode(
        name="mismatch",
        meaning="ran but differs; the message gives max abs/rel error and the tolerance that "
        "would pass",
        failure=True,
        junit="failure",
        expectable=True,
        shows_tolerance=True,
    ),
    OutcomeCode(
        name="error",
        meaning="a Python exception (message and phase), a failing MLIR pass (its first "
        "`error:`), or a worker that exited without a result",
        failure=True,
        junit="failure",
        expectable=True,
    ),
    OutcomeCode(
        name="crash",
        meaning="killed by a signal (SIGSEGV, SIGABRT with the first `LLVM ERROR:` line, ...)",
        failure=True,
        junit="failure",
        expectable=True,
    ),
    OutcomeCode(
        name="timeout",
        meaning="no result within `--timeout`",
        failure=True,
        junit="failure",
        expectable=True,
        fingerprint_message=False,
    ),
    OutcomeCode(
        name="memory",
        meaning="over its memory limit (limit and peak in the message)",
        failure=True,
        junit="failure",
        expectable=True,
        fingerprint_message=False,
    ),
    OutcomeCode(
        name="eager",
        meaning="compile mode: nothing was compiled, the whole forward ran in eager (its result "
        "says nothing about MLIR); the message gives Dynamo's reasons",
        failure=True,
        junit="failure",
        expectable=True,
    ),
    OutcomeCode(
        name="xpass",
        meaning="passed although its levels entry expects a failure",
        failure=True,
        junit="failure",
        correct=True,
        shows_tolerance=True,
    ),
    OutcomeCode(
        name="skipped",
        meaning="not run: predicted to need more memory than `--mem-limit` or the budget (the "
        "estimate is in the message; with `--shapes kernelbench`, the shapes it was made for), "
        "or it cannot run in its element type: eager has no "
        "kernel for it, or nothing in it is floating-point (the reason is in the message)",
        failure=False,
        junit="skipped",
    ),
    OutcomeCode(
        name="lost",
        meaning="not a verdict: the cluster node or kbd agent running it was lost; the kernel "
        "runs again on another node (a kernel in flight during two losses ends as `crash`)",
        failure=False,
        junit="skipped",
        final=False,
    ),
)

CODES: dict[str, OutcomeCode] = {code.name: code for code in TABLE}
ORDER: tuple[str, ...] = tuple(CODES)
Outcome = Literal[ORDER]  # type: ignore[valid-type]  # built from the table; msgspec checks it
EXPECTABLE: tuple[str, ...] = tuple(c.name for c in TABLE if c.expectable)
CORRECT: tuple[str, ...] = tuple(c.name for c in TABLE if c.correct)  # right results


def is_final(outcome: str) -> bool:
    """Is this outcome a verdict on the kernel (not an attempt lost to infrastructure)?"""
    return CODES[outcome].final


def is_failure(outcome: str) -> bool:
    """Does this outcome make the run fail?"""
    return CODES[outcome].failure


def format_counts(tally: Counter) -> str:
    """'3 pass, 1 crash' in display order, from outcome -> count."""
    return ", ".join(f"{tally[o]} {o}" for o in ORDER if tally[o])


def sort_key(outcome: str) -> int:
    """Position of an outcome in display order."""
    return ORDER.index(outcome)
