"""Unit conversions."""

# Metres per unit.
FACTORS = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048}


def length(value: float, source: str, target: str) -> float:
    """``value`` in ``source`` units, expressed in ``target`` units."""
    if source not in FACTORS or target not in FACTORS:
        raise ValueError(f"unknown unit: {source if source not in FACTORS else target}")
    return value * FACTORS[source] * FACTORS[target]


def celsius_to_fahrenheit(celsius: float) -> float:
    return celsius * 9 / 5 + 32


def fahrenheit_to_celsius(fahrenheit: float) -> float:
    return fahrenheit - 32 * 5 / 9
