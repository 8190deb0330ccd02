from datetime import date

from calutil import add_months, end_of_month, months_between, quarter_of


def test_add_months_within_year():
    assert add_months(date(2023, 3, 10), 2) == date(2023, 5, 10)


def test_add_months_clamps_to_leap_day():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)


def test_add_months_rolls_over_into_january():
    assert add_months(date(2023, 12, 10), 1) == date(2024, 1, 10)


def test_add_months_backwards_across_year():
    assert add_months(date(2024, 2, 29), -13) == date(2023, 1, 29)


def test_add_zero_months():
    assert add_months(date(2023, 6, 30), 0) == date(2023, 6, 30)


def test_end_of_month():
    assert end_of_month(date(2023, 2, 10)) == date(2023, 2, 28)
    assert end_of_month(date(2023, 12, 1)) == date(2023, 12, 31)


def test_months_between():
    assert months_between(date(2023, 1, 15), date(2023, 4, 14)) == 2
    assert months_between(date(2023, 4, 15), date(2023, 1, 15)) == -3


def test_quarter_of():
    assert [quarter_of(date(2023, m, 1)) for m in (1, 3, 4, 9, 10, 12)] == [1, 1, 2, 3, 4, 4]
