from unitconv.convert import celsius_to_fahrenheit, fahrenheit_to_celsius, length

__all__ = ["celsius_to_fahrenheit", "fahrenheit_to_celsius", "length"]
