"""Charts as inline SVG, rendered on the server: no script, nothing from another host."""

from __future__ import annotations

from html import escape

from markupsafe import Markup

WIDTH, HEIGHT, PAD = 640, 200, 36


def _scale(value: float, top: float) -> float:
    return HEIGHT - PAD - (value / top) * (HEIGHT - 2 * PAD) if top > 0 else HEIGHT - PAD


def line(points: list[tuple[str, float]], limit: float | None, title: str) -> Markup:
    """A cumulative line over labelled points, with the limit as a dashed line."""
    top = max([v for _, v in points] + [limit or 0, 1e-12]) * 1.1
    step = (WIDTH - 2 * PAD) / max(1, len(points) - 1)
    coords = " ".join(f"{PAD + i * step:.1f},{_scale(v, top):.1f}"
                      for i, (_, v) in enumerate(points))
    parts = [f'<svg class="chart" role="img" aria-label="{escape(title)}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">',
             f"<title>{escape(title)}</title>",
             f'<line class="axis" x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" '
             f'y2="{HEIGHT - PAD}"/>']
    if limit is not None:
        y = _scale(limit, top)
        parts.append(f'<line class="limit" x1="{PAD}" y1="{y:.1f}" x2="{WIDTH - PAD}" '
                     f'y2="{y:.1f}"/><text x="{WIDTH - PAD}" y="{y - 4:.1f}" '
                     f'text-anchor="end">limit {limit:g}</text>')
    if points:
        parts.append(f'<polyline class="series" points="{coords}"/>')
        parts.append(f'<text x="{PAD}" y="{HEIGHT - 8}">{escape(points[0][0])}</text>'
                     f'<text x="{WIDTH - PAD}" y="{HEIGHT - 8}" text-anchor="end">'
                     f"{escape(points[-1][0])}</text>")
    parts.append("</svg>")
    return Markup("".join(parts))


def bars(points: list[tuple[str, float]], title: str) -> Markup:
    """One bar per labelled value."""
    top = max([v for _, v in points] + [1e-12]) * 1.1
    width = (WIDTH - 2 * PAD) / max(1, len(points))
    parts = [f'<svg class="chart" role="img" aria-label="{escape(title)}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">',
             f"<title>{escape(title)}</title>"]
    for i, (label, value) in enumerate(points):
        y = _scale(value, top)
        parts.append(f'<rect class="bar" x="{PAD + i * width + 1:.1f}" y="{y:.1f}" '
                     f'width="{max(1.0, width - 2):.1f}" height="{HEIGHT - PAD - y:.1f}">'
                     f"<title>{escape(label)}: {value:g}</title></rect>")
    if points:
        parts.append(f'<text x="{PAD}" y="{HEIGHT - 8}">{escape(points[0][0])}</text>'
                     f'<text x="{WIDTH - PAD}" y="{HEIGHT - 8}" text-anchor="end">'
                     f"{escape(points[-1][0])}</text>")
    parts.append("</svg>")
    return Markup("".join(parts))
