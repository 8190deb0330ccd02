"""The rate table."""

# (limit in kg, price in cents).  Each bracket covers weights up to and
# including its limit and above the previous bracket's limit.
BRACKETS = [
    (1, 499),
    (2, 799),
    (5, 1299),
    (10, 1999),
    (20, 2999),
]
MAX_WEIGHT_KG = BRACKETS[-1][0]


class OverweightError(ValueError):
    pass


def rate_for(weight_kg):
    """Price in cents for a parcel of *weight_kg* kilograms."""
    if weight_kg <= 0:
        raise ValueError("weight must be positive")
    for limit, price in BRACKETS:
        if weight_kg < limit:
            return price
    raise OverweightError(f"{weight_kg} kg is over the {MAX_WEIGHT_KG} kg limit")
