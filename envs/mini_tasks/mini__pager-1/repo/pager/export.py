"""Chunked iteration for batch exports."""
from .core import page_bounds, page_count


def iter_chunks(items, size):
    """Yield consecutive slices of *items* with at most *size* elements."""
    for index in range(page_count(len(items), size)):
        start, stop = page_bounds(index, size)
        yield items[start:stop]
