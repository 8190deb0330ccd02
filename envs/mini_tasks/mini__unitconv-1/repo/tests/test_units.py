import unittest

from unitconv import celsius_to_fahrenheit, length


class LengthTests(unittest.TestCase):
    def test_same_unit(self):
        self.assertEqual(length(3, "m", "m"), 3)

    def test_kilometres_to_metres(self):
        self.assertAlmostEqual(length(5, "km", "m"), 5000)

    def test_unknown_unit(self):
        with self.assertRaises(ValueError):
            length(1, "m", "league")


class TemperatureTests(unittest.TestCase):
    def test_celsius_to_fahrenheit(self):
        self.assertAlmostEqual(celsius_to_fahrenheit(100), 212)
