"""Charts as inline SVG, rendered on the server: no script, nothing from another host."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT, PAD = 640, 200, 36


def _scale(value: float, top: float) -> float:
    return HEIGHT - PAD - (value / top) * (HEIGHT - 2 * PAD) if top > 0 else HEIGHT - PAD


def bars(points: list[tuple[str, float]], title: str) -> Markup:
    """One bar per labelled value, on a ticked axis."""
    ticks = nice_ticks(max([v for _, v in points] + [1e-12]) * 1.05)
    top, left = ticks[-1], PAD + 28
    width = (WIDTH - left - PAD) / max(1, len(points))
    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">',
        f"<title>{escape(title)}</title>",
    ]
    for value in ticks:
        y = _scale(value, top)
        parts.append(
            f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{WIDTH - PAD}" '
            f'y2="{y:.1f}"/><text class="tick" x="{left - 6}" y="{y + 4:.1f}" '
            f'text-anchor="end">{value:g}</text>'
        )
    for i, (label, value) in enumerate(points):
        # a day whose settles gave back more than it charged is below 0: no bar, its title
        # still says the figure (an SVG height may not be negative)
        y = _scale(max(value, 0.0), top)
        parts.append(
            f'<rect class="bar" x="{left + i * width + 1:.1f}" y="{y:.1f}" '
            f'width="{max(1.0, width - 2):.1f}" height="{HEIGHT - PAD - y:.1f}">'
            f"<title>{escape(label)}: {value:g}</title></rect>"
        )
    if points:
        parts.append(
            f'<text x="{left}" y="{HEIGHT - 8}">{escape(points[0][0])}</text>'
            f'<text x="{WIDTH - PAD}" y="{HEIGHT - 8}" text-anchor="end">'
            f"{escape(points[-1][0])}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top``: steps of 1, 2 or 5 times a power of 10."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _when(seconds: float, span: float) -> str:
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime(
        "%Y-%m-%d" if span > 2 * 86_400 else "%m-%d %H:%M" if span > 3_600 else "%H:%M:%S"
    )


def loss_over_time(
    points: list[tuple[float, float]],
    limits: list[tuple[float, float]],
    start: float,
    end: float,
    unit: str,
) -> Markup:
    """Lifetime loss after each charge (seconds, loss) drawn as steps from ``start`` to
    ``end``, against the limit's history drawn as dashed steps, with ticked axes in ``unit``
    and UTC time. The final value is written at the line's end."""
    width, height, left, right, top_pad, bottom = 720, 260, 64, 24, 16, 40
    span = max(end - start, 1e-6)
    highest = max([v for _, v in points] + [v for _, v in limits] + [1e-12])
    ticks = nice_ticks(highest * 1.05)
    y_top = ticks[-1]

    def x(t: float) -> float:
        return left + (min(max(t, start), end) - start) / span * (width - left - right)

    def y(v: float) -> float:
        return height - bottom - v / y_top * (height - top_pad - bottom)

    def stairs(series: list[tuple[float, float]], first: float) -> str:
        coords, level = [f"{x(start):.1f},{y(first):.1f}"], first
        for t, v in series:
            coords.append(f"{x(t):.1f},{y(level):.1f}")
            coords.append(f"{x(t):.1f},{y(v):.1f}")
            level = v
        coords.append(f"{x(end):.1f},{y(level):.1f}")
        return " ".join(coords)

    title = f"privacy loss over time ({unit}) against the limit"
    parts = [
        f'<svg class="chart loss-chart" role="img" aria-label="{escape(title)}" '
        f'viewBox="0 0 {width} {height}" data-y-top="{y_top!r}" '
        f'data-plot-top="{top_pad}" data-plot-bottom="{height - bottom}">',
        f"<title>{escape(title)}</title>",
        f'<line class="axis" x1="{left}" y1="{height - bottom}" x2="{width - right}" '
        f'y2="{height - bottom}"/>',
        f'<line class="axis" x1="{left}" y1="{top_pad}" x2="{left}" y2="{height - bottom}"/>',
    ]
    for value in ticks:
        parts.append(
            f'<line class="grid" x1="{left}" y1="{y(value):.1f}" x2="{width - right}" '
            f'y2="{y(value):.1f}"/><text class="tick" x="{left - 6}" '
            f'y="{y(value) + 4:.1f}" text-anchor="end">{value:g}</text>'
        )
    for i in range(5):
        t = start + span * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(
            f'<line class="axis" x1="{x(t):.1f}" y1="{height - bottom}" '
            f'x2="{x(t):.1f}" y2="{height - bottom + 4}"/><text class="tick" '
            f'x="{x(t):.1f}" y="{height - bottom + 16}" text-anchor="{anchor}">'
            f"{escape(_when(t, span))}</text>"
        )
    parts.append(
        f'<text class="unit" x="{left - 6}" y="{top_pad - 4}" text-anchor="end">'
        f'{escape(unit)}</text><text class="unit" x="{width - right}" '
        f'y="{height - 4}" text-anchor="end">time (UTC)</text>'
    )
    if limits:
        parts.append(
            f'<polyline class="limit" points="{stairs(limits[1:], limits[0][1])}"/>'
            f'<text class="limit-label" x="{width - right}" '
            f'y="{y(limits[-1][1]) - 4:.1f}" text-anchor="end">'
            f"limit {limits[-1][1]:g}</text>"
        )
    final = points[-1][1] if points else 0.0
    parts.append(
        f'<polyline class="series" points="{stairs(points, 0.0)}"/>'
        f'<text class="final-loss" x="{x(end) - 4:.1f}" y="{y(final) + 14:.1f}" '
        f'text-anchor="end">loss {final:g}</text>'
    )
    parts.append("</svg>")
    return Markup("".join(parts))
