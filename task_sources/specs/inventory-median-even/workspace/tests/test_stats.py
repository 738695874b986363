import pytest

from inventory.stats import mean, median, spread


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_odd_length():
    assert median([5, 1, 3]) == 3


def test_median_even_length():
    assert median([4, 1, 3, 2]) == 2.5


def test_median_empty():
    with pytest.raises(ValueError):
        median([])


def test_spread():
    assert spread([3, 9, 4]) == 6
