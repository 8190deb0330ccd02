from .api import list_page
from .core import page_bounds, page_count
from .export import iter_chunks

__all__ = ["list_page", "page_bounds", "page_count", "iter_chunks"]
