import pytest
from pydantic import ValidationError

from mascot.core.config import MascotConfig, load_config


def test_defaults_follow_reference():
    c = MascotConfig()
    assert c.dialogue.agent_turns_per_round == 3
    assert (c.selfplay.agent_turns, c.selfplay.user_speak_prob) == (6, 0.5)
    assert (c.director.max_retries, c.director.max_consecutive_turns, c.director.constrained) == (3, 2, True)
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


@pytest.mark.parametrize("text, says", [
    ("{{{\n", "is not valid YAML: "),
    ("engine:\n  model: [unclosed\n", "is not valid YAML: "),
    ("- a list\n- of things\n", "must be a YAML mapping of sections"),
    ("just a string\n", "must be a YAML mapping of sections"),
])
def test_a_broken_config_file_is_one_clear_error(tmp_path, monkeypatch, text, says):
    from mascot.core.config import ConfigFileError

    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigFileError, match=says) as e:
        load_config(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("MASCOT_CONFIG", str(f))  # the same through the environment variable
    with pytest.raises(ConfigFileError, match=says):
        load_config()


def test_a_config_path_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="is a directory"):
        load_config(tmp_path)


def test_an_empty_config_file_means_the_defaults(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing set\n")
    assert load_config(f) == MascotConfig()


def test_the_request_limit_holds_the_largest_valid_request_and_is_checked_at_start():
    """server.max_request_bytes (the gateway's gRPC receive limit, 1 MiB) is far below max_message_bytes yet holds
    a context at the dialogue limits in four-byte characters; a config where it cannot is refused at start."""
    from mascot.core.config import DialogueConfig, ServerConfig, largest_request_bytes

    mib = 1024 * 1024
    assert ServerConfig().max_request_bytes == mib < ServerConfig().max_message_bytes
    assert 4 * DialogueConfig().max_context_chars < largest_request_bytes(DialogueConfig()) <= mib
    with pytest.raises(ValidationError, match=r"server.max_request_bytes \(1048576\) is below .* raise "
                                              "server.max_request_bytes"):
        MascotConfig(dialogue={"max_context_chars": 1_000_000})
    assert MascotConfig(dialogue={"max_context_chars": 1_000_000}, server={"max_request_bytes": 5 * mib})
