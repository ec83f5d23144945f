"""Server-rendered SVG line charts of a group's snapshots: no JavaScript, no CDN.

``group_chart`` draws three panels over the last hours: backlog (lag, pending), throughput
(entries acknowledged per minute, from the growth of entries-read minus pending) and dead letters
(on a scale of their own, so one failed message is visible next to a backlog of thousands).
"""
from datetime import timedelta
from html import escape

from django.utils import timezone

WIDTH = 760
PANEL_HEIGHT = 150
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 56, 150, 24, 26
COLORS = {"lag": "#d9480f", "pending": "#1971c2", "dead letters": "#c92a2a", "acked / min": "#2b8a3e"}


def series_from(snapshots):
    """Snapshot rows (oldest first) -> {name: [(datetime, value), ...]}."""
    out = {"lag": [], "pending": [], "dead letters": [], "acked / min": []}
    previous = None
    for snap in snapshots:
        if snap.lag is not None:
            out["lag"].append((snap.taken_at, snap.lag))
        out["pending"].append((snap.taken_at, snap.pending))
        out["dead letters"].append((snap.taken_at, snap.dead_letters))
        if previous is not None and snap.entries_read is not None and previous.entries_read is not None:
            minutes = (snap.taken_at - previous.taken_at).total_seconds() / 60
            acked = (snap.entries_read - snap.pending) - (previous.entries_read - previous.pending)
            if minutes > 0:
                out["acked / min"].append((snap.taken_at, max(0.0, acked / minutes)))
        previous = snap
    return out


def _nice_max(value):
    if value <= 0:
        return 1
    step = 10 ** (len(str(int(value))) - 1)
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * step:
            return factor * step
    return 10 * step


def _integer_step(value):
    """The tick step of a count axis with four steps up to at least ``value``: 1, 2, 5 times a power of ten."""
    needed = max(1, -(-int(value) // 4))
    step = 1
    while True:
        for factor in (1, 2, 5):
            if factor * step >= needed:
                return factor * step
        step *= 10


def _time_format(span_seconds):
    if span_seconds > 24 * 3600:
        return "%a %H:%M"  # a week: the day too, or Monday's 10:00 reads as Tuesday's
    return "%H:%M" if span_seconds >= 4 * 60 else "%H:%M:%S"


def _number(value):
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def panel(title, series, start, end, y0, counts=True):
    """SVG elements of one panel whose top is at ``y0``; ``counts``: whole-number ticks (entries, letters)."""
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = PANEL_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    top = y0 + MARGIN_TOP
    span = max(1.0, (end - start).total_seconds())
    highest = max((v for points in series.values() for _, v in points), default=0)
    peak = 4 * _integer_step(highest) if counts else _nice_max(highest)

    def x(t):
        return MARGIN_LEFT + plot_w * (t - start).total_seconds() / span

    def y(v):
        return top + plot_h * (1 - v / peak)

    parts = [f'<text x="{MARGIN_LEFT}" y="{y0 + 15}" class="title">{escape(title)}</text>']
    for i in range(5):
        value = peak * i / 4
        parts.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>')
        parts.append(f'<text x="{MARGIN_LEFT - 6}" y="{y(value) + 4:.1f}" class="axis" text-anchor="end">{_number(value)}</text>')
    fmt, shown_labels = _time_format(span), set()
    for i in range(5):
        at = start + (end - start) * i / 4
        label = at.strftime(fmt)
        if label in shown_labels:
            continue  # a short span: the same minute twice says nothing
        shown_labels.add(label)
        parts.append(f'<text x="{x(at):.1f}" y="{top + plot_h + 16}" class="axis time" text-anchor="middle">{label}</text>')
    for n, (name, points) in enumerate(series.items()):
        color = COLORS.get(name, "#495057")
        legend_y = top + 14 * n + 6
        parts.append(f'<line x1="{WIDTH - MARGIN_RIGHT + 12}" x2="{WIDTH - MARGIN_RIGHT + 30}" y1="{legend_y}" y2="{legend_y}" stroke="{color}" stroke-width="3"/>')
        last = f" {_number(points[-1][1])}" if points else " -"
        parts.append(f'<text x="{WIDTH - MARGIN_RIGHT + 36}" y="{legend_y + 4}" class="legend">{escape(name)}{last}</text>')
        shown = [(t, v) for t, v in points if start <= t <= end]
        if len(shown) == 1:
            t, v = shown[0]
            parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>')
        elif shown:
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in shown)
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2" class="series" data-series="{escape(name)}"/>')
    return parts


def group_chart(stream, group, hours=6, now=None):
    """The SVG of ``stream``/``group`` over the last ``hours``, or '' when there are no snapshots."""
    from streams_app.models import GroupSnapshot

    end = now or timezone.now()
    start = end - timedelta(hours=hours)
    snapshots = list(GroupSnapshot.objects.filter(stream=stream, group=group, taken_at__gte=start, taken_at__lte=end)
                     .order_by("taken_at"))
    if not snapshots:
        return ""
    data = series_from(snapshots)
    start = max(start, snapshots[0].taken_at - timedelta(minutes=1))
    parts = panel("Backlog", {k: data[k] for k in ("lag", "pending")}, start, end, 0)
    parts += panel("Throughput", {"acked / min": data["acked / min"]}, start, end, PANEL_HEIGHT, counts=False)
    parts += panel("Dead letters", {"dead letters": data["dead letters"]}, start, end, 2 * PANEL_HEIGHT)
    height = 3 * PANEL_HEIGHT
    style = ("<style>.title{font:bold 13px sans-serif;fill:#333}.axis{font:11px sans-serif;fill:#666}"
             ".legend{font:12px sans-serif;fill:#333}.grid{stroke:#e9ecef;stroke-width:1}</style>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="shoal-chart" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(f"{stream}:{group} over the last {hours} hours")}">'
            + style + "".join(parts) + "</svg>")
