"""Parse and format amounts of money as integer cents."""
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation


def parse_amount(text):
    """Parse ``"12.34"`` or ``"-0.5"`` into cents (half-up to whole cents)."""
    try:
        value = Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        raise ValueError(f"not an amount: {text!r}") from None
    if not value.is_finite():
        raise ValueError(f"not an amount: {text!r}")
    return int((value * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def format_cents(cents, symbol="$"):
    """Format cents as ``$1,234.56`` (``-$0.50`` for negatives)."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{symbol}{whole:,}.{frac:02d}"
