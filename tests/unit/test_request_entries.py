"""Model-service requests are capped in entries as well as bytes: countless empty history turns or context entries
(zero characters each) are INVALID_ARGUMENT before any work, whatever service receives them."""

import pytest

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.dialogue import MAX_REQUEST_ENTRIES, context_from_proto, history_from_proto
from mascot.core.errors import InvalidArgument


def test_history_and_context_entry_caps():
    user = dpb.Turn(role=dpb.ROLE_USER, text="")
    assert len(history_from_proto([user] * MAX_REQUEST_ENTRIES)) == MAX_REQUEST_ENTRIES
    with pytest.raises(InvalidArgument, match=f"history has {MAX_REQUEST_ENTRIES + 1} turns"):
        history_from_proto([user] * (MAX_REQUEST_ENTRIES + 1))
    empty = dpb.ContextUtterance()
    assert context_from_proto([empty] * MAX_REQUEST_ENTRIES) == [("", "")] * MAX_REQUEST_ENTRIES
    with pytest.raises(InvalidArgument, match=f"context has {MAX_REQUEST_ENTRIES + 1} entries"):
        context_from_proto([empty] * (MAX_REQUEST_ENTRIES + 1))
