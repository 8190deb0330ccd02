import pytest

from ledger import format_cents, parse_amount, split_amount


def test_parse_amount():
    assert parse_amount("12.34") == 1234
    assert parse_amount(" 1,000 ") == 100000


def test_parse_amount_rounds_half_up():
    assert parse_amount("0.125") == 13
    assert parse_amount("19.99") == 1999


def test_parse_amount_rejects_garbage():
    with pytest.raises(ValueError):
        parse_amount("twelve")


def test_format_cents():
    assert format_cents(123456) == "$1,234.56"
    assert format_cents(-50) == "-$0.50"


def test_split_even():
    assert split_amount(900, 3) == [300, 300, 300]


def test_split_single_part():
    assert split_amount(1234, 1) == [1234]


def test_split_rejects_zero_parts():
    with pytest.raises(ValueError):
        split_amount(100, 0)
