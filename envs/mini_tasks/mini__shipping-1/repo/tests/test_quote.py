import pytest

from shipping import Item, quote


def test_quote_sums_item_weights():
    items = [Item("lamp", weight_g=1800), Item("bulb", weight_g=120, qty=3)]
    assert quote(items) == 1299  # 2.16 kg


def test_quote_fractional_weight():
    assert quote([Item("kettle", weight_g=2500)]) == 1299


def test_quote_express_surcharge():
    assert quote([Item("mug", weight_g=350, qty=4)], express=True) == 1198


def test_quote_requires_items():
    with pytest.raises(ValueError):
        quote([])


def test_item_rejects_zero_quantity():
    with pytest.raises(ValueError):
        Item("ghost", weight_g=100, qty=0)
