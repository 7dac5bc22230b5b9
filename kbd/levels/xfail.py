"""`kbd levels update-xfail`: expected failures in the levels files, from a stored sweep.

For every kernel of the sweep (default: the latest), by the outcome table
(`kbd/shared/outcomes.py`):
- an expectable failure (mismatch, error, crash, timeout, memory) gets
  `xfail: {outcome, phase, message}`, message being the first line of the kernel's message
  (with `dtype` when the sweep ran in another element type than f32, so that the expectation
  holds for that type only; an existing xfail of another type is left alone); it is
  left out where the table says the message is no stable fingerprint (memory, timeout);
- a correct result (`pass`, `xpass`) loses the key: the kernel works now;
- any other outcome (`xfail`, `skipped`) and kernels not in the sweep are left alone.

A sweep at KernelBench's own shapes (`--shapes kernelbench`) is refused: its outcomes are no
evidence for the shapes the levels entries give.

Files are edited line by line in the generator's layout (`kbd.plan.schema`), so comments stay
and a regeneration keeps the key. Each file is validated by the catalog before it is written.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from kbd.plan import catalog, schema, spec
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared.errors import InputError
from kbd.shared.outcomes import CODES

MESSAGE_CHARS = 160


def expectation(record: Record) -> dict | None:
    """The xfail value a record calls for; None to drop the key."""
    code = CODES[record.outcome]
    if not code.expectable:
        return None
    message = record.message.split(" [expected ", 1)[0].strip()  # without the verdict note
    first = message.splitlines()[0][:MESSAGE_CHARS] if message else ""
    value = {"outcome": record.outcome, "phase": record.phase}
    if first and code.fingerprint_message:
        value["message"] = first
    if record.dtype != "f32":  # evidence from a sweep in another element type holds for it only
        value["dtype"] = record.dtype
    return value


def decisions(records: list[Record]) -> dict[str, dict | None]:
    """Kernel path -> new xfail value (None: drop it), for the records the table lets us judge."""
    return {
        f"{r.kernel}.py": expectation(r)
        for r in records
        if (CODES[r.outcome].expectable or CODES[r.outcome].correct)
        and r.mode == "import"  # xfail keys are written from import-mode evidence
    }


def rewrite(text: str, decided: dict[str, dict | None]) -> str:
    """Apply decisions to a levels file's text; `xfail` is the last key of an entry."""
    out: list[str] = []
    current = None

    def close(kernel: str | None) -> None:
        if decided.get(kernel) is None:
            return
        end = len(out)  # after the entry's last line, before comments that follow it
        while end > 0 and not out[end - 1].startswith(("  ", "- kernel: ")):
            end -= 1
        out.insert(end, f"  xfail: {schema.flow(decided[kernel])}")

    for line in text.splitlines():
        if line.startswith("- kernel: "):
            close(current)
            current = line.removeprefix("- kernel: ").strip()
        elif current in decided and line.startswith("  xfail:"):
            continue
        out.append(line)
    close(current)
    return "\n".join(out) + "\n"


def _same_dtype(entry: catalog.Entry | None, dtype: str) -> bool:
    """May a sweep in element type `dtype` replace or drop this entry's xfail? Only one written
    for that type (an xfail without `dtype` is f32's)."""
    if entry is None or entry.xfail is None:
        return True
    return (entry.xfail.dtype or "f32") == dtype


def run(args: Namespace) -> int:
    path = Path(args.db)
    if not path.exists():
        raise InputError(f"{path}: no results database (run `kbd sweep` first or pass --db)")
    store = Store(path)
    sweep = store.sweep(args.sweep)
    if spec.decode(sweep.options, f"{path}: sweep {sweep.id}").shapes == "kernelbench":
        raise InputError(
            f"sweep {sweep.id} ran at KernelBench's own shapes (--shapes kernelbench): its "
            "outcomes say nothing of the levels entries' shapes, whose xfail this writes"
        )
    records = store.records(sweep.id)
    decided = decisions(records)
    records_dtype = records[0].dtype if records else "f32"
    files = [Path(f) for f in args.levels] or catalog.default_levels_files()
    texts = {file: catalog.read_levels_text(file) for file in files}
    updates = {}
    for file, text in texts.items():  # every file valid before and after, before any is written
        entries = catalog.load_text(text, file)
        mine = {e.kernel: e for e in entries}
        kept = {k: v for k, v in decided.items() if _same_dtype(mine.get(k), records_dtype)}
        new = rewrite(text, kept)
        if new != text:
            catalog.load_text(new, file)
            updates[file] = new
    for file, new in updates.items():
        file.write_text(new)
        print(f"updated {file}")
    expected = sum(1 for v in decided.values() if v is not None)
    print(
        f"sweep {sweep.id}: {expected} expected failures recorded, "
        f"{len(decided) - expected} kernels without one"
    )
    return 0
