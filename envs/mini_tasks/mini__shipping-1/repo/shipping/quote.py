"""Quotes for whole orders."""
from .rates import rate_for

EXPRESS_SURCHARGE_PERCENT = 50


def to_kg(grams):
    """Convert a weight in grams to kilograms."""
    return grams // 1000


def quote(items, express=False):
    """Price in cents to ship *items* as one parcel."""
    if not items:
        raise ValueError("nothing to ship")
    total_g = sum(item.total_g for item in items)
    price = rate_for(to_kg(total_g))
    if express:
        price += price * EXPRESS_SURCHARGE_PERCENT // 100
    return price
