"""The HTML report's tuning section: one stored tuning session, per task (kernel) the figures
and verdict of its summary table (kbd.results.tune_summary, the same computation), the adopted
configuration's variables, and a chart of its trials in order (speedup with interval, failures
marked). The section carries its data as JSON (`<script id="kbd-tuning">`)."""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kbd.plan.space import Config
from kbd.results.tune_summary import TaskSummary, interval, speedup
from kbd.results.tuning import Session, Trial

CHART_WIDTH, CHART_HEIGHT = 380, 170
CHART_MARGIN = {"left": 40, "right": 10, "top": 12, "bottom": 34}
FAILURE_BAND = 14  # pixels under the speedup axis where failed configurations are marked


@dataclass(frozen=True)
class TuningSession:
    """A session and its tasks' summaries, as the section shows them."""

    session: Session
    tasks: list[TaskSummary]


def render(tuning: TuningSession) -> str:
    """The section for one session."""
    session = tuning.session
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(session.created))
    parts = [
        f"<h2 id='tuning-{session.id}'>Tuning session {session.id}</h2>",
        f"<p>{html.escape(session.status)}, started {started}: "
        f"<code>{html.escape(session.command)}</code></p>",
        "<p>Each configuration's speedup over eager is measured while searching, one process "
        "per configuration, with its 95% interval. The verdict times the best and the default "
        "again in fresh processes: the best is adopted when the interval of its gain over the "
        "default lies above 1, else the default stays.</p>",
    ]
    if not tuning.tasks:
        parts.append("<p>No task of this session has a trial yet.</p>")
    else:
        parts.append(_table(tuning.tasks))
        parts.append("<div class='charts'>")
        parts += [_chart(task) for task in tuning.tasks]
        parts.append("</div>")
    data = json.dumps({"session": session.id, "tasks": [_data(t) for t in tuning.tasks]})
    data = data.replace("</", "<\\/")  # no `</script>` inside
    parts.append(f"<script type='application/json' id='kbd-tuning'>{data}</script>")
    return "<section class='tuning'>\n" + "\n".join(parts) + "\n</section>"


COLUMNS = (
    "kernel",
    "schedule",
    "configs",
    "measured",
    "failed",
    "default",
    "95% interval",
    "best",
    "95% interval",
    "verdict",
    "adopted configuration",
)
# The columns of free text (schedule, verdict, configuration): wrapped, left-aligned
_TEXT_COLUMNS = {1, 9, 10}


def _table(tasks: Sequence[TaskSummary]) -> str:
    head = "".join(
        f"<th class='text'>{name}</th>" if i in _TEXT_COLUMNS else f"<th>{name}</th>"
        for i, name in enumerate(COLUMNS)
    )
    lines = [f"<table class='tuning'><tr>{head}</tr>"]
    for t in tasks:
        cells = [
            html.escape(t.kernel),
            f"<code>{html.escape(t.descriptor or '-')}</code>",
            "-" if t.configs is None else str(t.configs),
            str(t.measured),
            _failures(t),
            speedup(t.default),
            _interval(t.default),
            speedup(t.best),
            _interval(t.best),
            f"<span class='{_verdict_class(t)}'>{html.escape(t.verdict.text)}</span>",
            _adopted(t),
        ]
        lines.append(
            "<tr>"
            + "".join(
                f"<td class='text'>{c}</td>" if i in _TEXT_COLUMNS else f"<td>{c}</td>"
                for i, c in enumerate(cells)
            )
            + "</tr>"
        )
    lines.append("</table>")
    return "\n".join(lines)


def _interval(trial: Trial | None) -> str:
    """'1.1 - 1.3', as the kernel table above writes an interval."""
    text = interval(trial)
    return text.strip("[]").replace(", ", " - ") if text else ""


def _failures(task: TaskSummary) -> str:
    if not task.failures:
        return "0"
    return ", ".join(
        f"<span class='failed'>{count} {html.escape(outcome)}</span>"
        for outcome, count in task.failures.items()
    )


def _verdict_class(task: TaskSummary) -> str:
    if task.verdict.adopted:
        return "adopted"
    return "failed" if task.best is None else "kept"


def _adopted(task: TaskSummary) -> str:
    """The adopted configuration's variables, those that differ from the default in bold; for
    a default that stays, 'default'."""
    if not task.verdict.adopted or task.verdict.config is None:
        return "<span class='kept'>default</span>"
    return _vars(task.verdict.config, task.default_config or {})


def _vars(config: Config, default: Config) -> str:
    shown = []
    for name, value in sorted(config.items()):
        text = html.escape(f"{name}={value}")
        shown.append(f"<b>{text}</b>" if default.get(name) != value else text)
    return "<code>" + " ".join(shown) + "</code>"


def _chart(task: TaskSummary) -> str:
    """The task's search trials in order: each timed configuration's speedup with its interval
    (the default in orange, the best in green), each failure a red cross under the axis; the
    default's speedup as a dashed line."""
    trials = task.searched
    x0, x1 = CHART_MARGIN["left"], CHART_WIDTH - CHART_MARGIN["right"]
    y0, y1 = CHART_HEIGHT - CHART_MARGIN["bottom"] - FAILURE_BAND, CHART_MARGIN["top"]
    highs = [t.high if t.high is not None else t.speedup for t in trials if t.timed]
    step = _tick_step(max(highs, default=1.0))
    ticks = math.ceil(max(highs, default=1.0) / step - 1e-9) or 1
    top = ticks * step

    def x(i: int) -> float:
        return x0 + (i + 0.5) / max(len(trials), 1) * (x1 - x0)

    def y(value: float) -> float:
        return y0 - min(value / top, 1.0) * (y0 - y1)

    parts = [f"<rect x='{x0}' y='{y1}' width='{x1 - x0}' height='{y0 - y1}' class='frame'/>"]
    for i in range(ticks + 1):
        at = y(i * step)
        parts.append(f"<line x1='{x0}' y1='{at:.1f}' x2='{x1}' y2='{at:.1f}' class='grid'/>")
        parts.append(
            f"<text x='{x0 - 5}' y='{at + 4:.1f}' class='tick' text-anchor='end'>"
            f"{i * step:.3g}</text>"
        )
    if task.default is not None and task.default.timed:
        level = y(task.default.speedup)
        parts.append(
            f"<line x1='{x0}' y1='{level:.1f}' x2='{x1}' y2='{level:.1f}' class='parity'/>"
        )
    band = y0 + FAILURE_BAND / 2 + 2
    for i, trial in enumerate(trials):
        tip = f"<title>{html.escape(_tip(i, trial))}</title>"
        if trial.timed:
            kind = _point_class(task, trial)
            if trial.low is not None and trial.high is not None:
                parts.append(
                    f"<line x1='{x(i):.1f}' y1='{y(trial.low):.1f}' x2='{x(i):.1f}' "
                    f"y2='{y(trial.high):.1f}' class='range {kind}'/>"
                )
            parts.append(
                f"<circle cx='{x(i):.1f}' cy='{y(trial.speedup):.1f}' r='3.5' "
                f"class='point {kind}'>{tip}</circle>"
            )
        else:
            parts.append(
                f"<path d='M{x(i) - 3:.1f},{band - 3:.1f} l6,6 m0,-6 l-6,6' class='cross'/>"
                f"<rect x='{x(i) - 4:.1f}' y='{band - 4:.1f}' width='8' height='8' "
                f"class='hit'>{tip}</rect>"
            )
    if task.failures:
        parts.append(
            f"<text x='{x0 - 5}' y='{band + 4:.1f}' class='tick failed' text-anchor='end'>"
            "failed</text>"
        )
    parts.append(
        f"<text x='{(x0 + x1) / 2}' y='{CHART_HEIGHT - 6}' class='label'>"
        f"configurations in the order measured ({len(trials)})</text>"
    )
    parts.append(
        f"<text x='10' y='{(y0 + y1) / 2}' class='label' "
        f"transform='rotate(-90 10 {(y0 + y1) / 2})'>speedup over eager</text>"
    )
    return (
        f"<figure><figcaption>{html.escape(task.kernel)}</figcaption>"
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{CHART_WIDTH}' height='{CHART_HEIGHT}' "
        f"viewBox='0 0 {CHART_WIDTH} {CHART_HEIGHT}'>"
        + "".join(parts)
        + "</svg>"
        + _KEY
        + "</figure>"
    )


_KEY = (
    "<div class='tune-key'><span class='default'>&#9679; default</span>"
    "<span class='best'>&#9679; best (ringed: the default)</span>"
    "<span class='other'>&#9679; other</span>"
    "<span class='failed'>&#215; failed (hover: configuration and result)</span></div>"
)


def _point_class(task: TaskSummary, trial: Trial) -> str:
    """best, default (both: the default is the best), or other."""
    kinds = [k for k, t in (("best", task.best), ("default", task.default)) if trial == t]
    return " ".join(kinds) or "other"


def _tip(index: int, trial: Trial) -> str:
    config = " ".join(f"{k}={v}" for k, v in sorted(trial.config.items()))
    if trial.timed:
        result = f"{speedup(trial)} {interval(trial)}"
    else:
        message = f": {trial.message[:120]}" if trial.message else ""
        result = f"{trial.outcome} in {trial.phase}{message}"
    return f"#{index + 1} {{{config}}}: {result}"


def _tick_step(value: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten that covers `value` in 5 steps."""
    if value <= 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(value / 5))
    return next(m * scale for m in (1, 2, 5, 10) if 5 * m * scale >= value)


def _data(task: TaskSummary) -> dict:
    """A task's figures for the page's JSON."""

    def figures(trial: Trial | None) -> dict | None:
        if trial is None or not trial.timed:
            return None
        return {"speedup": trial.speedup, "low": trial.low, "high": trial.high}

    return {
        "kernel": task.kernel,
        "descriptor": task.descriptor,
        "configs": task.configs,
        "measured": task.measured,
        "failures": task.failures,
        "default": figures(task.default),
        "best": figures(task.best),
        "verdict": task.verdict.text,
        "adopted": task.verdict.adopted,
        "gain": task.verdict.gain,
        "gain_low": task.verdict.gain_low,
        "config": task.verdict.config,
        "trials": [
            {"outcome": t.outcome, "phase": t.phase, "speedup": t.speedup, "config": t.config}
            for t in task.searched
        ],
    }


STYLE = """
section.tuning { margin-top: 32px; }
h2 { font-size: 17px; margin-top: 28px; }
table.tuning th { background: #f4f4f4; vertical-align: bottom; }
table.tuning td { vertical-align: top; }
table.tuning th.text, table.tuning td.text { text-align: left; }
table.tuning td.text { white-space: normal; min-width: 12em; max-width: 24em; }
table.tuning td.text code { overflow-wrap: anywhere; }
table.tuning td:nth-child(5) { white-space: normal; min-width: 6em; }  /* failures */
table.tuning td span.failed { white-space: nowrap; }
.failed { color: #b22; } .adopted { color: #2a7d2a; font-weight: 600; } .kept { color: #555; }
svg .point.other { fill: #1f77b4; } svg .point.best { fill: #2ca02c; }
svg .point.default { fill: #ff7f0e; }
svg .point.best.default { fill: #2ca02c; stroke: #ff7f0e; stroke-width: 2.5; }
svg .range { stroke-width: 1.5; } svg .range.other { stroke: #9cc3e4; }
svg .range.default { stroke: #ffbf86; } svg .range.best { stroke: #98df8a; }
svg .cross { stroke: #b22; stroke-width: 1.8; fill: none; } svg .hit { fill: transparent; }
svg .tick.failed { fill: #b22; }
.tune-key { font-size: 12px; display: flex; gap: 12px; margin-left: 40px; }
.tune-key .default { color: #ff7f0e; } .tune-key .best { color: #2ca02c; }
.tune-key .other { color: #1f77b4; }
"""
