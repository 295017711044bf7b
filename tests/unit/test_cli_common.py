"""The CLI's configuration errors: one line per problem naming the setting, the reason and the value given."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mascot.cli.common import validation_message
from mascot.core.config import MascotConfig


def test_a_bad_value_names_its_setting_the_choices_and_what_was_given():
    with pytest.raises(ValidationError) as e:
        MascotConfig(engine={"kind": "foo"}, server={"no_such_key": 1})
    message = validation_message(e.value)
    assert "engine.kind: Input should be 'transformers' or 'vllm' (got 'foo')" in message
    assert "server.no_such_key: Extra inputs are not permitted (got 1)" in message
    assert "errors.pydantic.dev" not in message and "\n" not in message
