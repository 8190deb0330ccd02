"""Short previews of longer texts."""


def truncate_words(text, limit, ellipsis="..."):
    """Keep at most *limit* words of *text*, adding *ellipsis* if cut."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    words = text.split()
    if len(words) <= limit:
        return " ".join(words)
    return " ".join(words[:limit]) + ellipsis
