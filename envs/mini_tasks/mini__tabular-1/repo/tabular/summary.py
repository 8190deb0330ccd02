"""Statistics over numeric columns."""
from .reader import column


def numeric_summary(rows, name):
    """Return count, min, max and mean of column *name*, ignoring empty cells."""
    values = [float(v) for v in column(rows, name) if v != ""]
    if not values:
        return {"count": 0, "min": None, "max": None, "mean": None}
    return {
        "count": len(values),
        "min": min(values),
        "max": max(values),
        "mean": sum(values) / len(values),
    }
