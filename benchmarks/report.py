"""Markdown tables and number formatting shared by the benchmarks."""

import math
import statistics


def fmt(value, digits=3):
    """Compact number: None/NaN -> '-', else `digits` significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return "%.*f" % (decimals, value)


def markdown_table(headers, rows):
    """headers: list of str; rows: lists of cells (str or numbers, formatted with fmt)."""
    cells = [[c if isinstance(c, str) else fmt(c) for c in row] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError("row has %d cells, header %d: %r" % (len(row), len(headers), row))
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def error_text(error):
    """The informative line of an exception (TF's start with 'in user code:')."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "%s: %s" % (type(error).__name__, (lines[-1] if lines else "")[:200])
