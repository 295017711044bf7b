"""The evaluation gate's decision rule (mascot.gateway.promote_gate.decide) at its boundaries."""

import pytest

from mascot.core.errors import FailedPrecondition
from mascot.gateway.promote_gate import decide


def test_equal_or_better_passes_and_worse_fails_with_no_allowed_drop():
    assert decide([3.0, 4.0], [3.0, 4.0], 0.0) == (3.5, 3.5, True)
    assert decide([3.2, 4.0], [3.0, 4.0], 0.0)[2] is True
    assert decide([2.9, 4.0], [3.0, 4.0], 0.0) == (pytest.approx(3.45), 3.5, False)


def test_the_allowed_drop_is_inclusive():
    assert decide([2.5], [3.0], 0.5)[2] is True
    assert decide([2.49], [3.0], 0.5)[2] is False


def test_no_pair_cannot_decide_and_bad_input_is_refused():
    with pytest.raises(FailedPrecondition, match="none of 4 situations"):
        decide([], [], 0.0, asked=4)
    with pytest.raises(ValueError, match="differ in length"):
        decide([1.0], [], 0.0)
    with pytest.raises(ValueError, match="max_drop"):
        decide([1.0], [1.0], -0.1)
