"""An acknowledged turn survives SIGKILL of the gateway; a retry with the same key finishes the round."""

import pytest

from tests.helpers.persistence import check_sigkill_and_resume

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_acknowledged_turn_survives_sigkill_and_retry_finishes_round(tiny_model_dir, tmp_path):
    await check_sigkill_and_resume(tiny_model_dir, tmp_path, f"sqlite:///{tmp_path}/store.db")
