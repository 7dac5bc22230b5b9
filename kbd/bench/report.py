"""One self-contained HTML page for a sweep's benchmark: the fast_p curve, the distribution of
speedups and a sortable per-kernel table. Inline SVG, CSS and a few lines of script; no network
needed to view it. The page also carries its data as JSON (`<script id="kbd-data">`).

A sweep run with `--baseline inductor` shows both baselines: the levels table gains fast_p over
Inductor and the two geomeans (kbd over Inductor, and Inductor over eager on the same kernels),
the fast_p chart a curve over Inductor per level, a second histogram, and the kernel table the
speedup over Inductor, Inductor's time, GFLOPS and compile time, or why Inductor failed. A page
of records without Inductor figures is the same as before.

After the sweep, the page may show a tuning session (kbd.bench.tune_report); a store with
tuning sessions and no sweep gets a page of that section alone.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence

from kbd.bench import summary, tune_report
from kbd.results.record import Record
from kbd.results.stats import format_ns

WIDTH, HEIGHT = 560, 260
MARGIN = {"left": 48, "right": 16, "top": 16, "bottom": 40}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
# Curves over Inductor, dashed as well: the i-th level's is INDUCTOR_COLORS[i]
INDUCTOR_COLORS = ("#ff7f0e", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#8c564b")


def render(
    records: Sequence[Record] | None,
    title: str,
    tuning: tune_report.TuningSession | None = None,
) -> str:
    """The page for these records (one sweep; None: a store without sweeps), and after them
    a tuning session's section (kbd.bench.tune_report), as a string."""
    if records is None:
        body = [f"<h1>{html.escape(title)}</h1>"]
        if tuning is not None:
            body.append(tune_report.render(tuning))
        return _PAGE.format(
            title=html.escape(title),
            body="\n".join(body),
            data=json.dumps({"title": title}),
            script="",
            style=_STYLE + tune_report.STYLE,
        )
    timed = summary.benchmarked(records)
    rows = [_row(r) for r in records]
    levels = summary.by_level(records)
    modes = summary.modes(records)
    inductor = has_inductor(records)
    body = [f"<h1>{html.escape(title)}</h1>"]
    body.append(
        f"<p>{len(records)} kernels, {len(timed)} passed and timed. Speedup is eager median time "
        "over compiled median time (above 1: compiled is faster); fast_p is the fraction of all "
        "selected kernels that are correct and faster than p times eager.</p>"
    )
    if inductor:
        against = sum(r.bench.speedup_inductor is not None for r in timed)
        body.append(
            f"<p>Second baseline, Inductor (<code>torch.compile(model)</code>), timed against "
            f"{against} of them: the speedup over Inductor is Inductor median time over compiled "
            "median time, and fast_p over Inductor counts all selected kernels too. On the same "
            "kernels, Inductor's own geomean speedup over eager is the figure to hold kbd's "
            "against. Inductor's compile time is not part of its timings.</p>"
        )
    if "compile" in modes:
        body.append(
            "<p>In compile mode the compiled side is the whole compiled forward (Dynamo's guards, "
            "the compiled subgraphs and what ran in eager) called from Python, timed with the "
            "same Python loop as eager.</p>"
        )
    body.append(_levels_table(levels, several_modes=len(modes) > 1, inductor=inductor))
    families = summary.by_family(records)
    if len(families) > 1:
        body.append(_families_table(families, inductor))
    if timed:
        body.append('<div class="charts">')
        body.append(_fast_p_chart(records))
        for mode in modes:
            caption = f" ({mode} mode)" if len(modes) > 1 else ""
            speedups = [r.bench.speedup for r in timed if r.mode == mode]
            if speedups:
                body.append(_histogram(speedups, caption))
            over = [r.bench.speedup_inductor for r in timed if r.mode == mode]
            over = [s for s in over if s is not None]
            if over:
                body.append(_histogram(over, caption, baseline="Inductor"))
        body.append("</div>")
    body.append(_kernel_table(rows, inductor=inductor))
    if tuning is not None:
        body.append(tune_report.render(tuning))
    levels_data = [_level_data(x, inductor) for x in levels]
    data = json.dumps({"title": title, "levels": levels_data, "kernels": rows})
    return _PAGE.format(
        title=html.escape(title),
        body="\n".join(body),
        data=data.replace("</", "<\\/"),
        script=_SCRIPT,
        style=_STYLE
        + (_INDUCTOR_STYLE if inductor else "")
        + (tune_report.STYLE if tuning is not None else ""),
    )


def has_inductor(records: Sequence[Record]) -> bool:
    """Whether any record was timed against Inductor (`--baseline inductor`), or tried to be."""
    return any(
        r.bench is not None and (r.bench.speedup_inductor is not None or r.bench.inductor_error)
        for r in records
    )


def _row(r: Record) -> dict:
    row: dict = {"kernel": r.kernel, "mode": r.mode, "outcome": r.outcome}
    if r.dtype != "f32":  # pages of f32 sweeps stay as they were
        row["dtype"] = r.dtype
    if r.bench is not None:
        b = r.bench
        row.update(
            speedup=b.speedup,
            speedup_low=b.speedup_low,
            speedup_high=b.speedup_high,
            compiled_ns=b.compiled.median_ns,
            eager_ns=b.eager.median_ns,
            compiled_gflops=b.compiled.gflops,
            eager_gflops=b.eager.gflops,
            n=b.compiled.n,
            unstable=b.unstable,
        )
        if b.inductor is not None and b.speedup_inductor is not None:
            row.update(
                speedup_inductor=b.speedup_inductor,
                speedup_inductor_low=b.speedup_inductor_low,
                speedup_inductor_high=b.speedup_inductor_high,
                inductor_ns=b.inductor.median_ns,
                inductor_gflops=b.inductor.gflops,
                inductor_compile_s=b.inductor_compile_s,
            )
        elif b.inductor_error:
            row.update(inductor_error=b.inductor_error)
    return row


def _level_data(level: summary.LevelFigures, inductor: bool = False) -> dict:
    data = {
        "level": level.level,
        "mode": level.mode,
        "kernels": level.kernels,
        "timed": level.timed,
        "fast_p": level.fast_p,
        "geomean_speedup": level.geomean_speedup,
    }
    if inductor:
        data.update(
            inductor_timed=level.inductor_timed,
            fast_p_inductor=level.fast_p_inductor,
            geomean_over_inductor=level.geomean_over_inductor,
            geomean_inductor_over_eager=level.geomean_inductor_over_eager,
        )
    return data


def _levels_table(
    levels: Sequence[summary.LevelFigures], several_modes: bool, inductor: bool = False
) -> str:
    """fast_p and the geomean per level; with Inductor figures, two rows per level, over eager
    then over Inductor (with Inductor's own geomean over eager on the kernels timed against
    it), so that each fast_p over Inductor stands under the same one over eager."""
    head = "".join(f"<th>fast_{p:g}</th>" for p in summary.P_VALUES)
    mode_head = "<th>mode</th>" if several_modes else ""
    if not inductor:
        lines = [
            f"<table class='levels'><tr><th>level</th>{mode_head}<th>kernels</th><th>timed</th>"
            f"{head}<th>geomean speedup</th></tr>"
        ]
    else:
        lines = [
            f"<table class='levels'><tr><th>level</th>{mode_head}<th>kernels</th>"
            f"<th class='over'>over</th><th>timed</th>{head}<th>geomean speedup</th>"
            "<th>Inductor over eager</th></tr>"
        ]
    for lv in levels:
        cells = "".join(f"<td>{lv.fast_p[f'{p:g}']:.3f}</td>" for p in summary.P_VALUES)
        if not inductor:
            geo = f"{lv.geomean_speedup:.3g}x" if lv.geomean_speedup else "-"
            mode = f"<td>{lv.mode}</td>" if several_modes else ""
            lines.append(
                f"<tr><td>{lv.level}</td>{mode}<td>{lv.kernels}</td><td>{lv.timed}</td>{cells}"
                f"<td>{geo}</td></tr>"
            )
            continue
        span = "<td rowspan='2'>{}</td>"
        mode = span.format(lv.mode) if several_modes else ""
        over = "".join(
            f"<td>{lv.fast_p_inductor.get(f'{p:g}', 0.0):.3f}</td>" for p in summary.P_VALUES
        )
        lines += [
            f"<tr class='first'>{span.format(lv.level)}{mode}{span.format(lv.kernels)}"
            f"<td class='over'>eager</td><td>{lv.timed}</td>{cells}"
            f"<td>{_times(lv.geomean_speedup)}</td><td></td></tr>",
            f"<tr class='baseline'><td class='over'>Inductor</td><td>{lv.inductor_timed}</td>{over}"
            f"<td>{_times(lv.geomean_over_inductor)}</td>"
            f"<td>{_times(lv.geomean_inductor_over_eager)}</td></tr>",
        ]
    lines.append("</table>")
    return "\n".join(lines)


def _families_table(families: Sequence[summary.FamilyFigures], inductor: bool) -> str:
    """The geomeans per schedule family of the timed kernels (summary.by_family)."""
    head = "<th>family</th><th>timed</th><th>geomean over eager</th>"
    if inductor:
        head += "<th>over Inductor</th><th>Inductor over eager</th>"
    lines = [f"<table class='families'><tr>{head}</tr>"]
    for row in families:
        cells = f"<td>{html.escape(row.family)}</td><td>{row.timed}</td>"
        cells += f"<td>{_times(row.geomean_speedup)}</td>"
        if inductor:
            cells += f"<td>{_times(row.geomean_over_inductor)}</td>"
            cells += f"<td>{_times(row.geomean_inductor_over_eager)}</td>"
        lines.append(f"<tr>{cells}</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _times(value: float | None) -> str:
    return f"{value:.3g}x" if value else "-"


def _decades(values: Sequence[float]) -> tuple[int, int]:
    logs = [math.log10(v) for v in values if v > 0]
    low = min(math.floor(min(logs)), -1)
    high = max(math.ceil(max(logs)), 1)
    return low, high if high > low else low + 1


def _axes(low: int, high: int, y_label: str, x_label: str, y_max: float, y_fmt) -> list[str]:
    """Frame, log-x ticks at decades, y ticks at quarters of y_max."""
    x0, x1 = MARGIN["left"], WIDTH - MARGIN["right"]
    y0, y1 = HEIGHT - MARGIN["bottom"], MARGIN["top"]
    parts = [f"<rect x='{x0}' y='{y1}' width='{x1 - x0}' height='{y0 - y1}' class='frame'/>"]
    for d in range(low, high + 1):
        x = x0 + (d - low) / (high - low) * (x1 - x0)
        parts.append(f"<line x1='{x:.1f}' y1='{y0}' x2='{x:.1f}' y2='{y1}' class='grid'/>")
        parts.append(f"<text x='{x:.1f}' y='{y0 + 16}' class='tick'>{10.0**d:g}</text>")
    for i in range(5):
        y = y0 - i / 4 * (y0 - y1)
        parts.append(f"<line x1='{x0}' y1='{y:.1f}' x2='{x1}' y2='{y:.1f}' class='grid'/>")
        parts.append(
            f"<text x='{x0 - 6}' y='{y + 4:.1f}' class='tick' text-anchor='end'>"
            f"{y_fmt(y_max * i / 4)}</text>"
        )
    parts.append(f"<text x='{(x0 + x1) / 2}' y='{HEIGHT - 6}' class='label'>{x_label}</text>")
    parts.append(
        f"<text x='12' y='{(y0 + y1) / 2}' class='label' "
        f"transform='rotate(-90 12 {(y0 + y1) / 2})'>{y_label}</text>"
    )
    return parts


def _x(value: float, low: int, high: int) -> float:
    x0, x1 = MARGIN["left"], WIDTH - MARGIN["right"]
    position = (math.log10(value) - low) / (high - low)
    return x0 + min(max(position, 0.0), 1.0) * (x1 - x0)


def _y(fraction: float) -> float:
    y0, y1 = HEIGHT - MARGIN["bottom"], MARGIN["top"]
    return y0 - fraction * (y0 - y1)


def _fast_p_chart(records: Sequence[Record]) -> str:
    """fast_p against p (log scale), one step line per level and mode; with Inductor figures a
    second one over Inductor, dashed, in a colour of its own."""
    timed = summary.benchmarked(records)
    over_inductor = [r.bench.speedup_inductor for r in timed]
    over_inductor = [s for s in over_inductor if s is not None]
    low, high = _decades([r.bench.speedup for r in timed] + over_inductor)
    parts = _axes(low, high, "fast_p", "p (speedup threshold, log scale)", 1.0, lambda v: f"{v:g}")
    modes = summary.modes(records)
    lines = [
        (level, mode)
        for mode in modes
        for level in sorted({summary.level_of(r.kernel) for r in records if r.mode == mode})
    ]
    legend = []  # with Inductor figures, below the chart: (name, colour, dashed)

    def curve(speedups: Sequence[float], n: int, name: str, color: str, dashed: bool) -> None:
        parts.append(_step_line(speedups, n, low, high, color, dashed))
        if over_inductor:
            legend.append((name, color, dashed))
        else:  # in the chart's top right corner, as always
            parts.append(
                f"<text x='{WIDTH - MARGIN['right'] - 6}' y='{MARGIN['top'] + 14 + 14 * i}' "
                f"class='legend' fill='{color}' text-anchor='end'>{name}</text>"
            )

    for i, (level, mode) in enumerate(lines):
        mine = [r for r in records if summary.level_of(r.kernel) == level and r.mode == mode]
        name = f"{level} {mode}" if len(modes) > 1 else level
        timed_here = summary.benchmarked(mine)
        speedups = [r.bench.speedup for r in timed_here]
        against = [r.bench.speedup_inductor for r in timed_here]
        against = [s for s in against if s is not None]
        curve(
            speedups,
            len(mine),
            f"{name} over eager" if over_inductor else name,
            COLORS[i % len(COLORS)],
            dashed=False,
        )
        if against:
            color = INDUCTOR_COLORS[i % len(INDUCTOR_COLORS)]
            curve(against, len(mine), f"{name} over Inductor", color, dashed=True)
    x1 = _x(1.0, low, high)
    parts.append(f"<line x1='{x1:.1f}' y1='{_y(0)}' x2='{x1:.1f}' y2='{_y(1)}' class='parity'/>")
    key = "".join(
        f"<span style='color: {color}'><span class='swatch' style='border-top: 2px "
        f"{'dashed' if dashed else 'solid'} {color}'></span>{html.escape(name)}</span>"
        for name, color, dashed in legend
    )
    return _svg("fast_p curve", parts, f"<div class='key'>{key}</div>" if legend else "")


def _step_line(
    speedups: Sequence[float], n: int, low: int, high: int, color: str, dashed: bool = False
) -> str:
    """The fast_p step curve of these speedups out of n kernels."""
    speedups = sorted(speedups)
    points = [(_x(10.0**low, low, high), _y(len(speedups) / n))]
    for j, s in enumerate(speedups):  # above s, one kernel fewer is faster than p
        points.append((_x(s, low, high), _y((len(speedups) - j) / n)))
        points.append((_x(s, low, high), _y((len(speedups) - j - 1) / n)))
    points.append((_x(10.0**high, low, high), _y(0.0)))
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dashes = " stroke-dasharray='6 3'" if dashed else ""
    return f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='2'{dashes}/>"


def _histogram(speedups: Sequence[float], caption: str = "", baseline: str = "eager") -> str:
    """Counts of kernels per quarter decade of speedup (over eager, or over Inductor)."""
    low, high = _decades(speedups)
    bins = [0] * ((high - low) * 4)
    for s in speedups:
        index = int((math.log10(s) - low) * 4)
        bins[min(max(index, 0), len(bins) - 1)] += 1
    top = max(4, math.ceil(max(bins) / 4) * 4)  # whole numbers at the quarter ticks
    x_label = f"speedup over {baseline} (log scale)"
    parts = _axes(low, high, "kernels", x_label, top, lambda v: f"{v:g}")
    bar = "bar" if baseline == "eager" else "bar baseline"
    for i, count in enumerate(bins):
        if not count:
            continue
        left = _x(10 ** (low + i / 4), low, high)
        right = _x(10 ** (low + (i + 1) / 4), low, high)
        top_y = _y(count / top)
        parts.append(
            f"<rect x='{left + 1:.1f}' y='{top_y:.1f}' width='{right - left - 2:.1f}' "
            f"height='{_y(0) - top_y:.1f}' class='{bar}'><title>{count} kernels</title></rect>"
        )
    x1 = _x(1.0, low, high)
    parts.append(f"<line x1='{x1:.1f}' y1='{_y(0)}' x2='{x1:.1f}' y2='{_y(1)}' class='parity'/>")
    over = "" if baseline == "eager" else f" over {baseline}"
    return _svg(f"distribution of speedups{over}{caption}", parts)


def _svg(title: str, parts: list[str], after: str = "") -> str:
    return (
        f"<figure><figcaption>{title}</figcaption>"
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}'>" + "".join(parts) + f"</svg>{after}</figure>"
    )


def _kernel_table(rows: Sequence[dict], inductor: bool = False) -> str:
    columns = [
        ("kernel", "kernel"),
        ("mode", "mode"),
        ("outcome", "outcome"),
        ("speedup", "speedup"),
        ("95% interval", "speedup_low"),
        ("compiled", "compiled_ns"),
        ("eager", "eager_ns"),
        ("compiled GFLOPS", "compiled_gflops"),
        ("eager GFLOPS", "eager_gflops"),
        ("n", "n"),
        ("stable", "unstable"),
    ]
    if inductor:
        columns += INDUCTOR_COLUMNS
    head = "".join(
        f"<th data-key='{key}'{_LEFT_RULE * (key == INDUCTOR_COLUMNS[0][1])}>{name}</th>"
        for name, key in columns
    )
    lines = [f"<table id='kernels' class='kernels'><thead><tr>{head}</tr></thead><tbody>"]
    for row in rows:
        cells = [
            _cell(row["kernel"], row["kernel"]),
            _cell(" ".join(filter(None, [row["mode"], row.get("dtype")])), row["mode"]),
            _cell(row["outcome"], row["outcome"], css=row["outcome"]),
        ]
        if "speedup" in row:
            cells += [
                _cell(f"{row['speedup']:.3g}x", row["speedup"]),
                _cell(f"{row['speedup_low']:.3g} - {row['speedup_high']:.3g}", row["speedup_low"]),
                _cell(format_ns(row["compiled_ns"]), row["compiled_ns"]),
                _cell(format_ns(row["eager_ns"]), row["eager_ns"]),
                _number(row["compiled_gflops"]),
                _number(row["eager_gflops"]),
                _cell(str(row["n"]), row["n"]),
                _cell("unstable" if row["unstable"] else "yes", int(row["unstable"])),
            ]
            if inductor:
                cells += _inductor_cells(row)
        else:
            cells += ["<td data-v=''></td>"] * (len(columns) - 3)
            if inductor:  # the rule left of the cells over Inductor
                cells[-len(INDUCTOR_COLUMNS)] = "<td data-v='' class='baseline'></td>"
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


# The kernel table's columns over Inductor, after eager's (label, key of the row's data)
INDUCTOR_COLUMNS = [
    ("over Inductor", "speedup_inductor"),
    ("95% interval", "speedup_inductor_low"),
    ("Inductor", "inductor_ns"),
    ("Inductor GFLOPS", "inductor_gflops"),
    ("Inductor compile", "inductor_compile_s"),
]
_LEFT_RULE = " class='baseline'"


def _inductor_cells(row: dict) -> list[str]:
    """A kernel's cells over Inductor: speedup, interval, time, GFLOPS, compile time; where
    Inductor failed, the reason across them all (the other cells are there, hidden, so that
    the sorting script finds every column's cell in every row)."""
    if "speedup_inductor" in row:
        low, high = row["speedup_inductor_low"], row["speedup_inductor_high"]
        compile_s = row["inductor_compile_s"]
        first = _cell(f"{row['speedup_inductor']:.3g}x", row["speedup_inductor"], "baseline")
        return [
            first,
            _cell(f"{low:.3g} - {high:.3g}", low),
            _cell(format_ns(row["inductor_ns"]), row["inductor_ns"]),
            _number(row["inductor_gflops"]),
            _cell("-", "") if compile_s is None else _cell(f"{compile_s:.3g}s", compile_s),
        ]
    if "inductor_error" in row:
        reason = html.escape(row["inductor_error"])
        failed = (
            f"<td data-v='' colspan='{len(INDUCTOR_COLUMNS)}' class='baseline failed'>"
            f"Inductor failed: {reason}</td>"
        )
        return [failed] + ["<td data-v='' hidden></td>"] * (len(INDUCTOR_COLUMNS) - 1)
    # not timed against Inductor (a sweep where only some kernels were)
    empty = ["<td data-v=''></td>"] * (len(INDUCTOR_COLUMNS) - 1)
    return ["<td data-v='' class='baseline'></td>", *empty]


def _cell(text: str, value, css: str = "") -> str:
    attribute = f" class='{css}'" if css else ""
    return f"<td data-v='{html.escape(str(value), quote=True)}'{attribute}>{html.escape(text)}</td>"


def _number(value: float | None) -> str:
    return _cell("-", "") if value is None else _cell(f"{value:.3g}", value)


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; }
table { border-collapse: collapse; margin: 12px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
td { white-space: nowrap; }
td:first-child, th:first-child { text-align: left; }
table.kernels th { cursor: pointer; background: #f4f4f4; position: sticky; top: 0; }
table.kernels th.sorted::after { content: " \\2195"; }
td.pass, td.xpass { color: #2a7d2a; }
td.mismatch, td.error, td.crash, td.timeout, td.memory { color: #b22; }
.charts { display: flex; flex-wrap: wrap; gap: 24px; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 4px; }
svg .frame { fill: none; stroke: #999; } svg .grid { stroke: #eee; }
svg .tick { font-size: 11px; text-anchor: middle; fill: #555; }
svg .label { font-size: 12px; text-anchor: middle; fill: #333; }
svg .legend { font-size: 12px; font-weight: 600; }
svg .bar { fill: #1f77b4; } svg .parity { stroke: #888; stroke-dasharray: 4 3; }
"""

_INDUCTOR_STYLE = """svg .bar.baseline { fill: #ff7f0e; }
table.levels tr.first td { border-top: 1px solid #bbb; }
table.levels tr.baseline td { color: #a35200; }
table.levels .over { text-align: left; }
th.baseline, td.baseline { border-left: 2px solid #bbb; }
td.failed { color: #b22; white-space: normal; text-align: left; max-width: 36em; }
.key { font-size: 12px; font-weight: 600; display: flex; flex-wrap: wrap; gap: 4px 16px;
  max-width: 560px; }
.key .swatch { display: inline-block; width: 22px; margin-right: 5px; vertical-align: middle; }
"""


_SCRIPT = """
document.querySelectorAll('#kernels th').forEach(function (th, column) {
  th.addEventListener('click', function () {
    var body = document.querySelector('#kernels tbody');
    var rows = Array.from(body.rows);
    var descending = th.dataset.order !== 'desc';
    th.dataset.order = descending ? 'desc' : 'asc';
    th.parentNode.querySelectorAll('th').forEach(function (h) {
      h.classList.remove('sorted');
    });
    th.classList.add('sorted');
    rows.sort(function (a, b) {
      var x = a.cells[column].dataset.v, y = b.cells[column].dataset.v;
      if (x === '' || y === '') { return x === '' ? 1 : -1; }
      var nx = parseFloat(x), ny = parseFloat(y);
      var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return descending ? -order : order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{style}</style></head>
<body>
{body}
<script type="application/json" id="kbd-data">{data}</script>
<script>{script}</script>
</body></html>
"""
