import pytest

from mascot.core.context import trim_oldest_first


def render(items):
    return " ".join(items)


def count(text):
    return len(text.split())


def test_nothing_dropped_when_it_fits():
    items = ["a b", "c d", "e"]
    assert trim_oldest_first(items, render, count, 5) == items


def test_oldest_dropped_first_until_fit():
    items = ["one two", "three four", "five six", "seven"]
    assert trim_oldest_first(items, render, count, 3) == ["five six", "seven"]
    assert trim_oldest_first(items, render, count, 5) == ["three four", "five six", "seven"]


def test_protected_item_kept_even_if_oldest():
    items = ["keep me", "x y", "z w", "tail"]
    kept = trim_oldest_first(items, render, count, 4, protected=lambda i, it: i == 0)
    assert kept == ["keep me", "tail"]


def test_error_when_protected_parts_cannot_fit():
    with pytest.raises(ValueError, match="does not fit"):
        trim_oldest_first(["a b c d e f"], render, count, 3, protected=lambda i, it: True)
