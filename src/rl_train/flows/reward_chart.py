"""The reward curve of a run as a self-contained SVG image, for the run page in the Prefect UI.

The project installs no plotting library (matplotlib alone would outweigh the rest of the
UI code), and a chart of two lines needs none: SVG is text, carries its own axis labels and
legend, and embeds in a markdown artifact as a ``data:`` URI, which the Prefect UI renders as
an ``<img>`` (an image element runs no script, so the URI cannot do anything but draw).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 640, 300
"""Size of the chart above its legend, which adds a row of 16 px per line it wraps to."""
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 28, 40
"""Plot margins in pixels: room for the y tick labels, the title and the x tick labels."""


@dataclass(frozen=True)
class Series:
    """One line of the chart: a metric's finite values at the steps that have it."""

    label: str
    color: str
    points: tuple[tuple[float, float], ...]
    dash: str = ""
    """SVG stroke-dasharray: the validation line is dashed so that it never hides the training
    line where the two coincide (a policy that scores 0 on both, for one)."""


def series_of(rows: Sequence[dict[str, Any]], key: str, color: str, dash: str = "") -> Series:
    """``key``'s finite values over ``step``; rows without it (or with a None/NaN, as
    ``metrics.jsonl`` stores a non-finite value) leave a gap rather than a fake zero."""
    points = []
    for row in rows:
        value, step = row.get(key), row.get("step")
        if isinstance(value, (int, float)) and math.isfinite(value) and isinstance(step, int):
            points.append((float(step), float(value)))
    return Series(key, color, tuple(points), dash)


def reward_series(rows: Sequence[dict[str, Any]]) -> list[Series]:
    """The training reward and the validation reward, in the chart's colours."""
    return [
        series_of(rows, "reward/mean", "#1f77b4"),
        series_of(rows, "val/reward_mean", "#ff7f0e", dash="6 4"),
    ]


def nice_step(span: float, target_ticks: int = 5) -> float:
    """A tick spacing of 1, 2 or 5 times a power of ten giving about ``target_ticks`` ticks."""
    raw = span / target_ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))


def value_axis(values: Sequence[float]) -> tuple[float, float, list[float]]:
    """[low, high] widened to round ticks around ``values``, and the ticks; a flat line gets a
    unit span so that it sits mid-chart rather than on an edge."""
    low, high = min(values), max(values)
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    step = nice_step(high - low)
    low, high = math.floor(low / step + 1e-9) * step, math.ceil(high / step - 1e-9) * step
    ticks = [low + i * step for i in range(round((high - low) / step) + 1)]
    return low, high, ticks


def step_ticks(first: float, last: float) -> list[int]:
    """Whole steps at a round spacing, within [first, last]."""
    step = max(1, round(nice_step(max(last - first, 1.0))))
    start = math.ceil(first / step) * step
    return list(range(int(start), int(last) + 1, step)) or [int(first)]


def _legend(series: Sequence[Series], top: float) -> tuple[list[str], float]:
    """Legend entries left to right under the plot, wrapping at the chart's width; returns the
    elements and the height they take."""
    out, x, y = [], float(LEFT), top
    for s in series:
        width = 24 + 6.5 * len(s.label) + 18
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, y = float(LEFT), y + 16
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(
            f'<line x1="{x:.1f}" x2="{x + 18:.1f}" y1="{y - 4:.1f}" y2="{y - 4:.1f}" stroke="{s.color}" '
            f'stroke-width="2"{dash}/><text x="{x + 24:.1f}" y="{y:.1f}">{escape(s.label)}</text>'
        )
        x += width
    return out, y - top + 16


def render_svg(series: Sequence[Series], title: str) -> str:
    """An SVG document: one polyline (and a dot per point) per non-empty series, round value
    and step ticks, and a legend under the plot. Steps map left to right, values bottom to top."""
    drawn = [s for s in series if s.points]
    xs = [x for s in drawn for x, _ in s.points] or [0.0, 1.0]
    x_low, x_high = (min(xs), max(xs)) if max(xs) > min(xs) else (min(xs) - 1, max(xs) + 1)
    y_low, y_high, y_ticks = value_axis([y for s in drawn for _, y in s.points] or [0.0, 1.0])
    decimals = max(0, -math.floor(math.log10(y_ticks[1] - y_ticks[0]) + 1e-9))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x_low) / (x_high - x_low) * plot_w

    def py(y: float) -> float:
        return TOP + (y_high - y) / (y_high - y_low) * plot_h

    legend, legend_h = _legend(series, HEIGHT + 8)
    height = HEIGHT + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height:.0f}" fill="white"/>',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    out += [
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#e5e5e5"/>'
        f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.{decimals}f}</text>'
        for y in y_ticks
    ]
    out += [
        f'<text x="{px(x):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{x}</text>'
        for x in step_ticks(x_low, x_high)
    ]
    out.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">global step</text>'
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>'
    )
    for s in drawn:
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(
            f'<polyline class="series" data-label="{escape(s.label)}" fill="none" '
            f'stroke="{s.color}" stroke-width="2"{dash} points="{points}"/>'
        )
        out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{s.color}"/>' for x, y in s.points)
    out += [*legend, "</svg>"]
    return "\n".join(out)


def svg_data_uri(svg: str) -> str:
    """The image as a ``data:`` URI (base64, so markdown sees no spaces or brackets in it)."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
