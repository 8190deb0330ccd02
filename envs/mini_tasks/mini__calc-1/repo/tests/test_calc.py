import pytest

from calc import CalcError, evaluate, tokenize


def test_tokenize_numbers_and_operators():
    tokens = tokenize("12 + 3.5*(4)")
    assert [t.value for t in tokens] == [12, "+", 3.5, "*", "(", 4, ")"]
    assert [t.pos for t in tokens] == [0, 3, 5, 8, 9, 10, 11]


def test_tokenize_rejects_unknown_character():
    with pytest.raises(CalcError, match="position 2"):
        tokenize("1 $ 2")


def test_addition_and_subtraction():
    assert evaluate("10 - 4 + 3") == 9


def test_multiplication_binds_tighter():
    assert evaluate("2 + 3 * 4") == 14


def test_parentheses():
    assert evaluate("(2 + 3) * 4") == 20


def test_simple_power():
    assert evaluate("2 ^ 10") == 1024


def test_unary_minus_binds_looser_than_power():
    assert evaluate("-2^2") == -4


def test_power_binds_tighter_than_multiplication():
    assert evaluate("2*3^2") == 18


def test_division_by_zero():
    with pytest.raises(CalcError, match="division by zero"):
        evaluate("1 / (2 - 2)")


def test_missing_closing_paren():
    with pytest.raises(CalcError, match="missing"):
        evaluate("(1 + 2")
