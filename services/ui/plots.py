"""Inline SVG plots, drawn here so the viewer needs no plotting library and no CDN."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT = 360, 170
PAD_L, PAD_R, PAD_T, PAD_B = 46, 10, 22, 26


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def _frame(title: str, body: str, label: str) -> Markup:
    return Markup(
        f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}"'
        f' role="img" aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<text class="plot-title" x="{PAD_L}" y="14">{escape(title)}</text>{body}</svg>'
    )


def line_plot(
    points: Sequence[tuple[float, float]], *, title: str, x_label: str = "step"
) -> Markup:
    """A line of (x, y) points with min/max ticks; an empty frame says there is no data."""
    pts = [(x, y) for x, y in points if y is not None and math.isfinite(y)]
    if not pts:
        body = f'<text class="plot-empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">not reported</text>'
        return _frame(title, body, f"{title}: not reported")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-9, y1 + abs(y1) * 0.1 + 1e-9
    iw, ih = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * iw

    def sy(y: float) -> float:
        return PAD_T + ih - (y - y0) / (y1 - y0) * ih

    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2"/>' for x, y in pts[-200:])
    body = (
        f'<line class="axis" x1="{PAD_L}" y1="{PAD_T + ih}" x2="{PAD_L + iw}" y2="{PAD_T + ih}"/>'
        f'<line class="axis" x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + ih}"/>'
        f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + 4}" text-anchor="end">{_fmt(y1)}</text>'
        f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + ih}" text-anchor="end">{_fmt(y0)}</text>'
        f'<text class="tick" x="{PAD_L}" y="{HEIGHT - 8}">{_fmt(x0)}</text>'
        f'<text class="tick" x="{PAD_L + iw}" y="{HEIGHT - 8}" text-anchor="end">'
        f"{escape(x_label)} {_fmt(x1)}</text>"
        f'<polyline class="series" points="{path}"/><g class="dots">{dots}</g>'
    )
    return _frame(title, body, f"{title}: {len(pts)} points, last {_fmt(ys[-1])}")


def histogram(counts: Sequence[int], *, lo: float, hi: float, title: str) -> Markup:
    """Bars for equal-width bins between `lo` and `hi`, each labelled with its count."""
    total = sum(counts)
    if not counts or total == 0:
        body = f'<text class="plot-empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">no scores yet</text>'
        return _frame(title, body, f"{title}: no scores yet")
    iw, ih = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B
    top = max(counts)
    bw = iw / len(counts)
    step = (hi - lo) / len(counts)
    bars = []
    for i, n in enumerate(counts):
        h = ih * n / top
        x, y = PAD_L + i * bw, PAD_T + ih - h
        edge = lo + i * step
        bars.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{y:.1f}" width="{bw - 2:.1f}" height="{h:.1f}">'
            f"<title>{_fmt(edge)}–{_fmt(edge + step)}: {n}</title></rect>"
        )
        if n:
            bars.append(
                f'<text class="tick" x="{x + bw / 2:.1f}" y="{y - 3:.1f}"'
                f' text-anchor="middle">{n}</text>'
            )
    body = (
        f'<line class="axis" x1="{PAD_L}" y1="{PAD_T + ih}" x2="{PAD_L + iw}" y2="{PAD_T + ih}"/>'
        + "".join(bars)
        + f'<text class="tick" x="{PAD_L}" y="{HEIGHT - 8}">{_fmt(lo)}</text>'
        f'<text class="tick" x="{PAD_L + iw}" y="{HEIGHT - 8}" text-anchor="end">{_fmt(hi)}</text>'
    )
    return _frame(title, body, f"{title}: {total} scores")
