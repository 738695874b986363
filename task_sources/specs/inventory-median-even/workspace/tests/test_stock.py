from inventory.stock import Item


def test_reorder_needed():
    item = Item("A-1", on_hand=5, daily_sales=[2, 3, 4])
    assert item.reorder_needed(lead_time_days=2)


def test_no_reorder_with_plenty():
    item = Item("A-2", on_hand=100, daily_sales=[2, 3, 4])
    assert not item.reorder_needed(lead_time_days=2)


def test_typical_sales_even_days():
    item = Item("A-3", on_hand=10, daily_sales=[1, 2, 3, 10])
    assert item.typical_daily_sales() == 2.5
