"""URL slugs."""
import re

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(text, sep="-", max_length=None):
    """Turn *text* into a lowercase ASCII slug.

    Runs of characters other than ASCII letters and digits become a single
    *sep*.  With *max_length*, the slug is cut to at most that many characters
    without leaving a trailing separator.
    """
    text = text.encode("ascii", "ignore").decode("ascii")
    slug = _NON_ALNUM.sub(sep, text.lower()).strip(sep)
    if max_length is not None:
        slug = slug[:max_length].rstrip(sep)
    return slug
