"""Split an amount of cents into shares."""


def split_amount(total_cents, parts):
    """Split *total_cents* into *parts* integer shares that add up to it."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    share = round(total_cents / parts)
    return [share] * parts
