"""Serving follows the registry with the real tiny engine: a conversation is pinned to
the versions it started with, every turn names its adapter version, greedy output equals the engine with that
adapter, promote / rollback / canary change only new conversations, and no request fails."""

from __future__ import annotations

import pytest

from tests.helpers.hot_load import check_hot_load

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_promote_canary_rollback_move_only_new_conversations(tmp_path, tiny_model_dir, monkeypatch):
    await check_hot_load(tmp_path, tiny_model_dir, monkeypatch)
