"""The outcome table: the facts derived from it and the README's copy of it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from kbd.plan.catalog import Expectation
from kbd.shared.outcomes import EXPECTABLE, ORDER, TABLE, format_counts
from kbd.shared.protocol import Result

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_wire_type_accepts_exactly_the_table():
    for name in ORDER:
        result = msgspec.json.decode(f'{{"outcome": "{name}", "phase": "run"}}', type=Result)
        assert result.outcome == name
    with pytest.raises(msgspec.ValidationError, match="outcome"):
        msgspec.json.decode('{"outcome": "mystery", "phase": "run"}', type=Result)


def test_readme_lists_every_outcome_in_table_order_with_its_meaning():
    text = README.read_text()
    start = text.index("| outcome | meaning |")
    rows = text[start : text.index("\n\n", start)].splitlines()[2:]
    parsed = [re.fullmatch(r"\| `(\w+)` \| (.*) \|", row).groups() for row in rows]
    assert parsed == [(c.name, c.meaning) for c in TABLE]


def test_expectable_outcomes_are_exactly_the_failures_that_say_the_kernel_is_wrong():
    """An `xfail` may name a failure that is a verdict against the kernel, and any such
    failure, so that update-xfail can record every one; never a correct result (xpass)."""
    assert tuple(c.name for c in TABLE if c.failure and not c.correct) == EXPECTABLE


def test_junit_failure_is_exactly_a_failing_outcome():
    assert [c.name for c in TABLE if c.junit == "failure"] == [c.name for c in TABLE if c.failure]


def test_counts_follow_display_order():
    tally = Counter({"skipped": 1, "crash": 2, "pass": 3, "xfail": 1})
    assert format_counts(tally) == "3 pass, 1 xfail, 2 crash, 1 skipped"


@pytest.mark.parametrize(("outcome", "matches"), [("memory", True), ("crash", False)])
def test_message_is_a_fingerprint_only_where_the_table_says_so(outcome, matches):
    expectation = Expectation(outcome, "jit", "LLVM ERROR: out of memory")
    assert expectation.matches(outcome, "jit", "MemoryError: unable to allocate") is matches
