import pytest

from shipping import OverweightError, rate_for


def test_rate_inside_bracket():
    assert rate_for(3.2) == 1299


def test_rate_just_over_a_limit():
    assert rate_for(2.01) == 1299


def test_rate_rejects_zero():
    with pytest.raises(ValueError):
        rate_for(0)


def test_rate_overweight():
    with pytest.raises(OverweightError):
        rate_for(20.5)
