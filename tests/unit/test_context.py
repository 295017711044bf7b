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


def _prompt(history, context):
    return "SYSTEM card\n" + "\n".join(f"{t.role}: {t.text}" for t in history) + "\nINSTRUCTION"


def test_a_latest_message_too_long_for_the_window_is_shown_with_its_middle_elided():
    from mascot.core.context import ELISION, trim_history_context
    from mascot.core.dialogue import HistoryTurn

    text = " ".join(f"w{i}" for i in range(200))  # 200 words; the budget below leaves room for about 50
    history = [HistoryTurn("user", "old"), HistoryTurn("agent", "reply", "anchor"), HistoryTurn("user", text)]
    h, c, cut = trim_history_context(history, [], _prompt, count, 60)
    assert cut and c == [] and len(h) == 1 and h[0].role == "user"
    shown = h[0].text
    assert ELISION in shown and shown.startswith("w0 w1") and shown.endswith("w198 w199")
    assert count(_prompt(h, [])) <= 60
    # as much as fits: one more kept character would not fit
    from mascot.core.context import elide_middle

    kept = len(shown) - len(ELISION)
    assert count(_prompt([HistoryTurn("user", elide_middle(text, kept + 1))], [])) > 60 or kept + 1 > len(text)
    assert history[2].text == text  # the caller's turn (the stored one) is untouched


def test_nothing_fits_when_the_system_prompt_alone_is_over_the_budget():
    from mascot.core.context import trim_history_context
    from mascot.core.dialogue import HistoryTurn

    with pytest.raises(ValueError, match="raise engine.max_model_len"):
        trim_history_context([HistoryTurn("user", "hello there")], [], _prompt, count, 2)
