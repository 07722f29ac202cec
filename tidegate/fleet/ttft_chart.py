"""`tidegate demo --plot DIR`: TTFT over time, one series per policy.

Each completed request is a dot at (time it was sent, its TTFT); a line per policy follows the
P95 of each `BUCKET_S` window, and a dashed line marks the TTFT SLO. TTFT spans milliseconds to
minutes past saturation, so the y axis is logarithmic. PNG through matplotlib when it is
installed (`tidegate[plot]`); otherwise one self-contained HTML file with an inline SVG, so the
chart needs no extra package.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from tidegate.fleet.report import RequestResult, percentile

BUCKET_S = 2.0
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")

Points = list[tuple[float, float]]


def ttft_points(results: Sequence[RequestResult]) -> Points:
    """(sent at, TTFT ms) of every request that got a first token, in send order."""
    return sorted((r.sent_s, r.ttft_s * 1000.0) for r in results if r.ok and r.ttft_s is not None)


def windowed_p95(points: Points, bucket_s: float = BUCKET_S) -> Points:
    """(window middle, P95 TTFT ms) per `bucket_s` window of send times that holds a request."""
    buckets: dict[int, list[float]] = {}
    for t, ms in points:
        buckets.setdefault(int(t // bucket_s), []).append(ms)
    return [((k + 0.5) * bucket_s, percentile(v, 95)) for k, v in sorted(buckets.items())]


def write(out_dir: Path, series: Mapping[str, Points], slo_ttft_ms: float, title: str) -> Path:
    """Write the chart into `out_dir` (created); returns the file written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib
    except ImportError:
        path = out_dir / "ttft_over_time.html"
        path.write_text(render_html(series, slo_ttft_ms, title))
        return path
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        if pts:
            ax.scatter([t for t, _ in pts], [max(ms, 1.0) for _, ms in pts], s=4, alpha=0.35, color=colour)
        p95 = windowed_p95(pts)
        ax.plot([t for t, _ in p95], [max(ms, 1.0) for _, ms in p95], color=colour, linewidth=1.6,
                label=f"{name} (P95 per {BUCKET_S:g} s)")
    ax.axhline(slo_ttft_ms, color="black", linestyle="--", linewidth=0.8, label=f"TTFT SLO {slo_ttft_ms:g} ms")
    ax.set_yscale("log")
    ax.set_xlabel("time the request was sent (s from the run's start)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    path = out_dir / "ttft_over_time.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def render_html(series: Mapping[str, Points], slo_ttft_ms: float, title: str) -> str:
    """The chart as one HTML page with an inline SVG (no script, no external file)."""
    w, h, left, right, top, bottom = 960, 420, 70, 20, 30, 50
    all_pts = [p for pts in series.values() for p in pts]
    t_max = max((t for t, _ in all_pts), default=1.0) or 1.0
    lo = math.floor(math.log10(max(1.0, min([ms for _, ms in all_pts] + [slo_ttft_ms]))))
    hi = math.ceil(math.log10(max([ms for _, ms in all_pts] + [slo_ttft_ms * 1.01])))
    hi = max(hi, lo + 1)

    def x(t: float) -> float:
        return left + (w - left - right) * t / t_max

    def y(ms: float) -> float:
        return top + (h - top - bottom) * (hi - math.log10(max(ms, 1.0))) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           'font-size="11">', f'<rect x="{left}" y="{top}" width="{w - left - right}" '
           f'height="{h - top - bottom}" fill="none" stroke="#999"/>']
    for e in range(lo, hi + 1):
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{y(10 ** e):.1f}" y2="{y(10 ** e):.1f}" '
                   'stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{y(10 ** e) + 4:.1f}" text-anchor="end">{10 ** e:g}</text>')
    for k in range(0, 6):
        t = t_max * k / 5
        out.append(f'<text x="{x(t):.1f}" y="{h - bottom + 16}" text-anchor="middle">{t:.0f}</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 8}" text-anchor="middle">time the request was sent '
               '(s from the run\'s start)</text>')
    out.append(f'<text x="14" y="{(top + h - bottom) / 2}" transform="rotate(-90 14 {(top + h - bottom) / 2})" '
               'text-anchor="middle">TTFT (ms, log)</text>')
    out.append(f'<line x1="{left}" x2="{w - right}" y1="{y(slo_ttft_ms):.1f}" y2="{y(slo_ttft_ms):.1f}" '
               'stroke="black" stroke-dasharray="5,4"/>')
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        out.extend(f'<circle cx="{x(t):.1f}" cy="{y(ms):.1f}" r="1.6" fill="{colour}" fill-opacity="0.35"/>'
                   for t, ms in pts)
        line = " ".join(f"{x(t):.1f},{y(ms):.1f}" for t, ms in windowed_p95(pts))
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
        out.append(f'<rect x="{left + 10}" y="{top + 8 + 16 * i}" width="12" height="3" fill="{colour}"/>')
        out.append(f'<text x="{left + 28}" y="{top + 13 + 16 * i}">{html.escape(name)} '
                   f'(P95 per {BUCKET_S:g} s)</text>')
    out.append("</svg>")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>"
            f"<body><h3>{html.escape(title)}</h3>\n" + "\n".join(out) +
            f"\n<p>Dashed: TTFT SLO {slo_ttft_ms:g} ms. Dots: one request each.</p></body></html>\n")
