import pytest
from pydantic import ValidationError

from mascot.core.config import MascotConfig, load_config


def test_defaults_follow_reference():
    c = MascotConfig()
    assert c.dialogue.agent_turns_per_round == 3
    assert (c.selfplay.agent_turns, c.selfplay.user_speak_prob) == (6, 0.5)
    assert (c.director.max_retries, c.director.max_consecutive_turns, c.director.constrained) == (2, 2, True)
    assert c.server.gateway_port == 50051


def test_precedence_yaml_env_flags(tmp_path, monkeypatch):
    f = tmp_path / "c.yaml"
    f.write_text("director:\n  max_retries: 1\n  max_tokens: 99\ndialogue:\n  agent_turns_per_round: 2\n")
    monkeypatch.setenv("MASCOT_DIRECTOR__MAX_RETRIES", "0")
    c = load_config(f, {"dialogue": {"agent_turns_per_round": 5}})
    assert c.director.max_retries == 0          # env beats YAML
    assert c.director.max_tokens == 99          # YAML beats defaults
    assert c.dialogue.agent_turns_per_round == 5  # flags beat everything


def test_unknown_keys_and_bad_values_rejected(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("director:\n  max_retrys: 1\n")
    with pytest.raises(ValidationError, match="max_retrys"):
        load_config(f)
    with pytest.raises(ValidationError, match="user_speak_prob"):
        MascotConfig(selfplay={"user_speak_prob": 2})
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.yaml")
