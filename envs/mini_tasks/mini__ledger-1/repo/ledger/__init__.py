from .money import format_cents, parse_amount
from .split import split_amount

__all__ = ["format_cents", "parse_amount", "split_amount"]
