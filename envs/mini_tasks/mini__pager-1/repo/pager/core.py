"""Shared pagination arithmetic.  Page indexes here are zero-based."""


def page_bounds(index, per_page):
    """Return the ``(start, stop)`` slice bounds of zero-based page *index*."""
    if index < 0:
        raise ValueError("page index must not be negative")
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    start = index * per_page
    return start, start + per_page


def page_count(total, per_page):
    """Number of pages needed for *total* items."""
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    return -(-total // per_page)
