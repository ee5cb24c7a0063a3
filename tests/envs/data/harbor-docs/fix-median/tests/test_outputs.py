from stats import median


def test_odd_length():
    assert median([3, 1, 2]) == 2


def test_even_length():
    assert median([4, 1, 3, 2]) == 2.5


def test_unsorted_input_is_not_modified():
    values = [5, 1, 4, 2]
    assert median(values) == 3
    assert values == [5, 1, 4, 2]
