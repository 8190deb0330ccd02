"""Pagination as exposed by the web API (page numbers start at 1)."""
from .core import page_bounds, page_count

MAX_PER_PAGE = 100


def list_page(items, page=1, per_page=20):
    """Return page number *page* (1-based) of *items* with its metadata."""
    if page < 1:
        raise ValueError("page numbers start at 1")
    per_page = min(per_page, MAX_PER_PAGE)
    start, stop = page_bounds(page, per_page)
    return {
        "page": page,
        "per_page": per_page,
        "total": len(items),
        "pages": page_count(len(items), per_page),
        "items": list(items[start:stop]),
        "has_next": stop < len(items),
    }
