"""Training progress as pictures (pure): a bar, sparklines, and a self-contained HTML page of
loss and throughput against the step, from the trainer's progress lines.

``ddptrain`` logs one line per report, "ddptrain: progress epoch=1/8 step=4/32 loss=2.3117
images_per_sec=652.4 eta_seconds=3 ..." (docs/trainer.md, Progress). ``ddpjob run`` reads them
from node 0's output as it relays it (a bar on each, on a terminal; sparklines at the end;
``--plot FILE``), ``ddpjob status JOB --plot`` from node 0's log on the cluster. A log is
anybody's text: what is read is bounded (``MAX_POINTS``, the newest kept; each value a finite
number) and the page escapes every word it shows.
"""
from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

#: The most points kept (the newest): a page and a sparkline stay small whatever the run's length.
MAX_POINTS = 2000
_LINE = re.compile(r"\bddptrain: (?:progress|done) (.*)$")
_FIELD = re.compile(r"(\w+)=(\S+)")
_BLOCKS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Point:
    step: int
    total: Optional[int] = None
    loss: Optional[float] = None
    images_per_sec: Optional[float] = None


def _number(text: Optional[str]) -> Optional[float]:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def point_of(line: str) -> Optional[Point]:
    """The progress a trainer line reports, or None for any other line."""
    found = _LINE.search(line)
    if found is None:
        return None
    fields = dict(_FIELD.findall(found.group(1)))
    step, _, total = (fields.get("step") or "").partition("/")
    if not step.isdigit():
        return None
    return Point(step=int(step), total=int(total) if total.isdigit() else None,
                 loss=_number(fields.get("loss")), images_per_sec=_number(fields.get("images_per_sec")))


def points_of(lines: Iterable[str]) -> list[Point]:
    """The progress points of a log, in order, the newest MAX_POINTS; a repeated step (the last
    report and the "done" line) once."""
    points: list[Point] = []
    for line in lines:
        point = point_of(line)
        if point is None:
            continue
        if points and points[-1].step == point.step:
            points[-1] = Point(point.step, point.total or points[-1].total,
                               point.loss if point.loss is not None else points[-1].loss,
                               points[-1].images_per_sec if point.images_per_sec is None else point.images_per_sec)
        else:
            points.append(point)
        if len(points) > MAX_POINTS:
            del points[0]
    return points


def bar(step: int, total: Optional[int], width: int = 20) -> str:
    """``[██████░░░░░░░░░░░░░░]  30% 12/40``, or the step alone when the total is unknown."""
    if not total or total <= 0:
        return f"step {step}"
    done = max(0.0, min(1.0, step / total))
    filled = int(done * width + 1e-9)
    return f"[{'█' * filled}{'░' * (width - filled)}] {int(done * 100 + 1e-9):3d}% {step}/{total}"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """The values as a line of block characters, at most ``width`` (each the mean of its share)."""
    if not values:
        return ""
    if len(values) > width:  # each chunk holds at least one value
        chunks = [values[i * len(values) // width:(i + 1) * len(values) // width] for i in range(width)]
        values = [sum(chunk) / len(chunk) for chunk in chunks]
    low, high = min(values), max(values)
    span = high - low
    return "".join(_BLOCKS[int((v - low) / span * (len(_BLOCKS) - 1) + 0.5) if span > 0 else 0] for v in values)


def _series(points: Sequence[Point], name: str) -> list[tuple[int, float]]:
    return [(p.step, getattr(p, name)) for p in points if getattr(p, name) is not None]


def summary(points: Sequence[Point]) -> list[str]:
    """``loss 2.311 ▇▇▇▆▅▃▂▁ 1.048 over steps 4-32``, and the same of images/s."""
    lines = []
    for name, label, digits in (("loss", "loss", 3), ("images_per_sec", "images/s", 0)):
        series = _series(points, name)
        if len(series) < 2:
            continue
        values = [v for _, v in series]
        lines.append(f"{label} {values[0]:.{digits}f} {sparkline(values)} {values[-1]:.{digits}f} "
                     f"over steps {series[0][0]}-{series[-1][0]}")
    return lines


def _svg(series: list[tuple[int, float]], label: str, width: int = 640, height: int = 220) -> str:
    pad = 40
    if len(series) < 2:
        return f"<p>{html.escape(label)}: fewer than two reports</p>"
    steps, values = [s for s, _ in series], [v for _, v in series]
    x0, x1, y0, y1 = min(steps), max(steps), min(values), max(values)
    xs = (width - 2 * pad) / ((x1 - x0) or 1)
    ys = (height - 2 * pad) / ((y1 - y0) or 1)
    path = " ".join(f"{pad + (s - x0) * xs:.1f},{height - pad - (v - y0) * ys:.1f}" for s, v in series)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="{html.escape(label)}">'
            f'<rect width="{width}" height="{height}" fill="#fff" stroke="#ccc"/>'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{path}"/>'
            f'<text x="{pad}" y="20" font-family="sans-serif" font-size="14">{html.escape(label)}</text>'
            f'<text x="4" y="{pad + 4}" font-family="sans-serif" font-size="11">{y1:.4g}</text>'
            f'<text x="4" y="{height - pad}" font-family="sans-serif" font-size="11">{y0:.4g}</text>'
            f'<text x="{pad}" y="{height - 10}" font-family="sans-serif" font-size="11">step {x0}</text>'
            f'<text x="{width - pad - 60}" y="{height - 10}" font-family="sans-serif" font-size="11">step {x1}</text>'
            "</svg>")


def page(points: Sequence[Point], title: str) -> str:
    """A self-contained HTML page (no script, no fetch): loss and images/s against the step."""
    name = html.escape(title)
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + name + "</title></head>"
            "<body style=\"font-family: sans-serif\"><h1>" + name + "</h1>"
            + _svg(_series(points, "loss"), "loss") + "<br>"
            + _svg(_series(points, "images_per_sec"), "images/s") + "</body></html>\n")
