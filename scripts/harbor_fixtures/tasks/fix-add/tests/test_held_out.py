from calc import add


def test_add_is_commutative_and_signed():
    assert add(1, 2) == add(2, 1) == 3
    assert add(-4, 1) == -3
