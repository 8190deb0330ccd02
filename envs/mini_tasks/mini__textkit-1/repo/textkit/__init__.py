from .preview import truncate_words
from .slug import slugify

__all__ = ["slugify", "truncate_words"]
