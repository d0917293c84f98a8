import json

from django import template

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@register.filter
def duration(seconds) -> str:
    """1h 02m, 3m 05s, 42.0s, 0.05s: short enough for a table cell."""
    if seconds is None or seconds == "":
        return "—"
    s = float(seconds)
    if s < 10:
        return f"{s:.2f}s"
    if s < 60:
        return f"{s:.1f}s"
    minutes, sec = divmod(int(round(s)), 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


@register.filter
def filesize(num) -> str:
    n = float(num or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@register.filter
def percent(value, total) -> int:
    try:
        return max(0, min(100, round(100 * float(value) / float(total))))
    except (TypeError, ValueError, ZeroDivisionError):
        return 0


@register.filter
def get(mapping, key):
    return (mapping or {}).get(key)
