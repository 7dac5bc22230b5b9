"""Human lines, JSON Lines, summary tables and JUnit XML from kernel records; what a run or sweep
prints as each kernel ends and when all have."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import msgspec

from kbd.bench import summary as bench_summary
from kbd.plan.invocation import Invocation
from kbd.plan.limits import format_size
from kbd.results.record import Record
from kbd.shared import containment
from kbd.shared.errors import InputError
from kbd.shared.outcomes import CODES, format_counts, sort_key
from kbd.views.progress import Progress


def line(record: Record) -> str:
    """One readable line: outcome, kernel, phase, time, peak memory, tolerance or message."""
    detail = []
    if record.dtype != "f32":
        detail.append(record.dtype)
    if record.passing_tolerance is not None and CODES[record.outcome].shows_tolerance:
        detail.append(f"tol {record.passing_tolerance:g}")
    if record.signal:
        detail.append(record.signal)
    if record.coverage is not None:
        detail.append(coverage(record))
    if record.message and record.outcome != "pass":
        detail.append(record.message)
    if record.bench is not None:
        b = record.bench
        versus = ""
        if b.speedup_inductor is not None:
            versus = (
                f"  over Inductor {b.speedup_inductor:.3g}x "
                f"[{b.speedup_inductor_low:.3g}, {b.speedup_inductor_high:.3g}]"
            )
        elif b.inductor_error:
            versus = f"  Inductor failed: {b.inductor_error}"
        detail.append(
            f"speedup {b.speedup:.3g}x [{b.speedup_low:.3g}, {b.speedup_high:.3g}]{versus}  "
            f"{bench_summary.describe(record)}"
        )
    paused = f" ({record.paused_s:.1f}s paused)" if record.paused_s >= 0.05 else ""
    return (
        f"{record.outcome.upper():<8} {record.label}  [{record.phase}]  {record.wall_s:.2f}s"
        f"{paused}  {format_size(record.peak_rss_bytes)}"
        + (f"  {'  '.join(detail)}" if detail else "")
    )


def shown(record: Record) -> str:
    """What a run shows for a finished kernel: its line, preceded by its levels entry's
    `warning` as lighthouse's KernelBench script prints it (`WARNING: <text>`)."""
    if record.warning:
        return f"WARNING: {record.warning}\n{line(record)}"
    return line(record)


def coverage(record: Record) -> str:
    """'2 graphs (14 ops), 1 break, 3 eager ops' for a compile-mode record."""
    c = record.coverage
    if c is None:
        return ""
    graphs = f"{c.subgraphs} graph{'s' * (c.subgraphs != 1)} ({c.graph_ops} ops)"
    breaks = f"{c.graph_breaks} break{'s' * (c.graph_breaks != 1)}"
    if not c.finished:
        return f"{graphs} compiled before the failure, {breaks}"
    eager = sum(c.eager_ops.values())
    return f"{graphs}, {breaks}, {eager} eager op{'s' * (eager != 1)}"


def json_line(record: Record) -> str:
    return msgspec.json.encode(record).decode()


def counts(records: list[Record]) -> str:
    return format_counts(Counter(r.outcome for r in records))


def summary(records: list[Record], wall_s: float | None = None) -> str:
    """The end-of-run table: counts per outcome, then every kernel that did not pass."""
    modes = sorted({r.mode for r in records}, key=lambda m: m != "import")
    lines = [f"{len(records)} kernels: {counts(records) or 'none run'}"]
    if len(modes) > 1:
        lines[0] = f"{len(records)} runs: {counts(records)}"
        for mode in modes:
            lines.append(f"  {mode}: {counts([r for r in records if r.mode == mode])}")
    if wall_s is not None:
        lines[0] += f" in {wall_s:.1f}s"
    compiled = [r for r in records if r.coverage is not None]
    if compiled:
        lines.append(compile_coverage(compiled))
    if len(modes) > 1:
        lines += ["", *side_by_side(records, modes)]
    others = [r for r in records if r.outcome != "pass"]
    if others:
        width = max(len(r.label) for r in others)
        lines.append("")
        lines.append(f"{'outcome':<9}{'kernel':<{width + 2}}{'phase':<28}message")
        for r in sorted(others, key=lambda r: (sort_key(r.outcome), r.key)):
            message = r.message if not r.signal else f"{r.signal}: {r.message}"
            lines.append(f"{r.outcome:<9}{r.label:<{width + 2}}{r.phase:<28}{message[:160]}")
    lines += artifacts(records)
    uncontained = containment_lines(records)
    if uncontained:
        lines += ["", *uncontained]
    if any(r.bench is not None for r in records):
        lines.append("")
        lines.append(bench_summary.table(records))
        lines += inductor_failures(records)
    return "\n".join(lines)


def inductor_failures(records: list[Record]) -> list[str]:
    """One line per reason Inductor could not be timed, with how many kernels and the first."""
    failed: dict[str, list[str]] = {}
    for r in records:
        if r.bench is not None and r.bench.inductor_error:
            failed.setdefault(r.bench.inductor_error, []).append(r.label)
    return [
        f"Inductor not timed for {len(kernels)} kernel{'s' * (len(kernels) > 1)} "
        f"({kernels[0]}{', ...' if len(kernels) > 1 else ''}): {reason}"
        for reason, kernels in sorted(failed.items(), key=lambda item: -len(item[1]))
    ]


def artifacts(records: list[Record], most: int = 10) -> list[str]:
    """Lines naming the reproducer bundles and the files --print-to, --object-file and
    --dump-assembly wrote (a count when there are more than `most`)."""
    lines = []
    bundled = [r for r in records if r.bundle]
    if bundled:
        lines += ["", "reproducer bundles (`kbd replay BUNDLE` reruns the failing stage):"]
        lines += [f"  {r.label}: {r.bundle}" for r in bundled]
    files = [(r.label, kind, path) for r in records for kind, path in r.dumps.items()]
    if len(files) > most:
        folders = sorted({str(Path(path).parent) for _, _, path in files if "/" in path})
        lines += ["", f"{len(files)} files written, in {', '.join(folders)}"]
    elif files:
        lines += ["", "written:"]
        lines += [f"  {label}: {kind}: {path}" for label, kind, path in files]
    return lines


def compile_coverage(records: list[Record]) -> str:
    """One line on how much of the compile-mode forwards went through MLIR."""
    finished = [r.coverage for r in records if r.coverage.finished]
    full = sum(1 for c in finished if c.subgraphs and not c.eager_ops)
    partial = sum(1 for c in finished if c.subgraphs and c.eager_ops)
    none = sum(1 for c in finished if not c.subgraphs)
    failed = len(records) - len(finished)
    graphs = sum(r.coverage.subgraphs for r in records)
    breaks = sum(r.coverage.graph_breaks for r in records)
    return (
        f"compile coverage: {full} fully compiled, {partial} with ops left to eager, "
        f"{none} nothing compiled"
        + (f", {failed} failed while compiling" * bool(failed))
        + f"; {graphs} graphs, {breaks} graph breaks"
    )


def side_by_side(records: list[Record], modes: list[str]) -> list[str]:
    """One row per kernel, one column per mode: outcome (and coverage in compile mode, and the
    speedup over eager with its interval when benchmarked, and over Inductor when timed
    against it)."""
    by_key = {r.key: r for r in records}
    kernels = list(dict.fromkeys(r.kernel for r in records))
    table = [[_mode_cell(by_key.get((kernel, mode))) for mode in modes] for kernel in kernels]
    width = max(len(k) for k in kernels)
    widths = [max(44, *(len(row[i]) + 2 for row in table)) for i in range(len(modes))]
    head = "".join(f"{m:<{w}}" for m, w in zip(modes, widths, strict=True))
    rows = [f"{'kernel':<{width + 2}}{head}".rstrip()]
    for kernel, cells in zip(kernels, table, strict=True):
        text = "".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True))
        rows.append(f"{kernel:<{width + 2}}{text}".rstrip())
    return rows


def _mode_cell(r: Record | None) -> str:
    if r is None:
        return "-"
    cell = r.outcome
    if r.coverage is not None:
        cell += f" ({coverage(r)})"
    if r.bench is not None:
        b = r.bench
        cell += f" {b.speedup:.3g}x [{b.speedup_low:.3g}, {b.speedup_high:.3g}]"
        if b.speedup_inductor is not None:
            cell += f", over Inductor {b.speedup_inductor:.3g}x"
    return cell


def write_junit(records: list[Record], path: Path, suite: str = "kbd") -> None:
    """JUnit XML: one testcase per kernel; failures as <failure>, skips as <skipped>."""
    kinds = Counter(CODES[r.outcome].junit for r in records)
    root = ET.Element("testsuites")
    suite_el = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(records)),
        failures=str(kinds["failure"]),
        errors="0",
        skipped=str(kinds["skipped"]),
        time=f"{sum(r.wall_s for r in records):.3f}",
    )
    for r in records:
        level, _, name = r.label.partition("/")
        case = ET.SubElement(
            suite_el, "testcase", classname=f"kbd.{level}", name=name, time=f"{r.wall_s:.3f}"
        )
        if r.bench is not None:
            properties = ET.SubElement(case, "properties")
            for key, value in bench_properties(r).items():
                ET.SubElement(properties, "property", name=key, value=value)
        text = f"{r.outcome} in {r.phase}" + (f" ({r.signal})" if r.signal else "")
        junit = CODES[r.outcome].junit
        if junit == "failure":
            failure = ET.SubElement(case, "failure", type=r.outcome, message=f"{text}: {r.message}")
            failure.text = f"{text}\n{r.message}\nlog: {r.log}"
        elif junit == "skipped":
            ET.SubElement(case, "skipped", message=f"{text}: {r.message}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    except OSError as exc:  # checked at the start (check_output); this is a late failure
        raise InputError(f"{path}: cannot write JUnit XML ({exc.strerror or exc})") from None


def bench_properties(record: Record) -> dict[str, str]:
    """A benchmarked kernel's figures as JUnit property name -> value."""
    b = record.bench
    figures = {
        "speedup": b.speedup,
        "speedup_low": b.speedup_low,
        "speedup_high": b.speedup_high,
        "compiled_median_ns": b.compiled.median_ns,
        "compiled_mad_ns": b.compiled.mad_ns,
        "eager_median_ns": b.eager.median_ns,
        "eager_mad_ns": b.eager.mad_ns,
        "samples": b.compiled.n,
        "compiled_gflops": b.compiled.gflops,
        "eager_gflops": b.eager.gflops,
        "overhead_ns": b.overhead_ns,
        "unstable": str(b.unstable).lower(),
        "loop": b.loop,
        # `--baseline inductor`: each only when set (Inductor timed, or why it failed)
        "speedup_inductor": b.speedup_inductor,
        "speedup_inductor_low": b.speedup_inductor_low,
        "speedup_inductor_high": b.speedup_inductor_high,
        "inductor_median_ns": b.inductor.median_ns if b.inductor else None,
        "inductor_mad_ns": b.inductor.mad_ns if b.inductor else None,
        "inductor_gflops": b.inductor.gflops if b.inductor else None,
        "inductor_compile_s": b.inductor_compile_s,
        "inductor_cached": str(b.inductor_cached).lower() if b.inductor else None,
        "inductor_error": b.inductor_error,
    }
    return {
        k: (f"{v:.6g}" if isinstance(v, float) else str(v))
        for k, v in figures.items()
        if v is not None
    }


def containment_lines(records: list[Record]) -> list[str]:
    """One line per missing mechanism and reason, with how many kernels ran without it."""
    tally = Counter(
        (key, reason)
        for record in records
        for key, reason in containment.missing(record.limits).items()
    )
    return [
        f"containment: {key} not enforced for {count} kernel{'s' if count > 1 else ''}: {reason}"
        for (key, reason), count in sorted(tally.items())
    ]


def show(invocation: Invocation, progress: Progress, record: Record) -> None:
    """One finished kernel: its line (after its warning, if any) above the progress block, or a
    JSON line on stdout (the warning is its `warning`)."""
    if invocation.json:
        print(json_line(record), flush=True)
        progress.finished(record, None)
    else:
        progress.finished(record, shown(record))


def report(
    invocation: Invocation,
    records: list[Record],
    wall: float,
    completed: bool,
    sweep_id: int | None,
) -> int:
    """Summary, JUnit, the resume hint at the end of a run or sweep; returns the exit status."""
    if invocation.junit:
        write_junit(records, Path(invocation.junit))
    if not invocation.json or sys.stderr.isatty():
        print(summary(records, wall), file=sys.stderr if invocation.json else sys.stdout)
    if sweep_id is not None and not completed:
        print(
            f"kbd: sweep {sweep_id} interrupted; continue with `kbd sweep --resume {sweep_id}`",
            file=sys.stderr,
        )
    if not completed:
        return 130
    return 1 if any(r.failed for r in records) else 0
