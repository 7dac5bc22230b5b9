"""Record expected failures in the levels files from the evidence of a stored sweep.

For every kernel of the sweep (default: the latest in .kbd/results.db), by the outcome table
(`kbd/outcomes.py`):
- an expectable failure (mismatch, error, crash, timeout, memory) gets
  `xfail: {outcome, phase, message}` where message is the first line of the failure message,
  left out where the table says the message is no stable fingerprint (memory, timeout);
- a correct result (`pass`, `xpass`) loses the key (the kernel works now);
- every other outcome (`xfail`, `skipped`) and kernels not in the sweep are left alone.

The files are edited line by line in the generator's layout (one `key: value` line per key,
`xfail` last), so `scripts/gen-levels` keeps the keys and regeneration stays a no-op.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from kbd.errors import InputError
from kbd.outcome import Record
from kbd.outcomes import CODES
from kbd.store import Store

ROOT = Path(__file__).resolve().parent.parent
MESSAGE_CHARS = 160


def expectation(record: Record) -> dict | None:
    """The xfail value a record calls for; None to drop the key."""
    code = CODES[record.outcome]
    if not code.expectable:
        return None
    message = record.message.split(" [expected ", 1)[0].strip()
    first = message.splitlines()[0][:MESSAGE_CHARS] if message else ""
    value = {"outcome": record.outcome, "phase": record.phase}
    if first and code.fingerprint_message:
        value["message"] = first
    return value


def flow(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


def rewrite(text: str, decisions: dict[str, dict | None]) -> str:
    """Apply decisions (kernel path -> xfail value, or None to drop it) to a levels file."""
    out: list[str] = []
    current = None

    def close(kernel: str | None) -> None:
        if decisions.get(kernel) is None:
            return
        end = len(out)  # after the entry's last line, before comments that follow it
        while end > 0 and not out[end - 1].startswith(("  ", "- kernel: ")):
            end -= 1
        out.insert(end, f"  xfail: {flow(decisions[kernel])}")

    for line in text.splitlines():
        if line.startswith("- kernel: "):
            close(current)
            current = line.removeprefix("- kernel: ").strip()
        elif current in decisions and line.startswith("  xfail:"):
            continue
        out.append(line)
    close(current)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", nargs="?", type=int, help="sweep id (default: latest)")
    parser.add_argument("--db", default=".kbd/results.db", help="results database")
    parser.add_argument("--levels", action="append", default=[], metavar="FILE",
                        help="levels files to update (default: levels/*.yaml)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if not Path(args.db).exists():
            raise InputError(f"{args.db}: no results database")
        store = Store(Path(args.db))
        sweep = store.sweep(args.sweep)
        records = store.records(sweep.id)
    except InputError as exc:
        print(f"update-xfail: error: {exc}", file=sys.stderr)
        return 2
    decisions = {
        f"{r.kernel}.py": expectation(r)
        for r in records
        if CODES[r.outcome].expectable or CODES[r.outcome].correct
    }
    files = [Path(f) for f in args.levels] or sorted((ROOT / "levels").glob("level*.yaml"))
    for path in files:
        text = path.read_text()
        new = rewrite(text, decisions)
        if new != text:
            path.write_text(new)
            print(f"updated {path}")
    expected = sum(1 for v in decisions.values() if v is not None)
    print(f"sweep {sweep.id}: {expected} expected failures recorded, "
          f"{len(decisions) - expected} kernels without one")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
