from .models import Item
from .quote import quote, to_kg
from .rates import BRACKETS, MAX_WEIGHT_KG, OverweightError, rate_for

__all__ = ["Item", "quote", "to_kg", "rate_for", "BRACKETS", "MAX_WEIGHT_KG", "OverweightError"]
