"""The control plane's token file, roles and settings (the servers: tests/reliability/test_control_plane.py)."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from mascot.core.config import MascotConfig
from mascot.gateway.control_auth import ROLES, ControlAuth, Identity, WatchedFile, parse_control_tokens

TOKEN = "x" * 16


def test_token_entries_map_to_identities_and_roles():
    got = parse_control_tokens(f"# who:role=token\nvera:viewer={TOKEN}a\n  otto : operator = {TOKEN}b , "
                               f"ada:admin={TOKEN}c\n", "f")
    assert sorted((i.name, i.role) for i in got.values()) == [("ada", "admin"), ("otto", "operator"),
                                                              ("vera", "viewer")]
    assert all(TOKEN not in repr(k) for k in got)  # digests only


@pytest.mark.parametrize("text,fragment", [
    (f"vera={TOKEN}", "role ''"), (f"vera:root={TOKEN}", "role 'root'"), ("vera:viewer=short", "at least 16"),
    (f"vera:viewer={TOKEN}\notto:admin={TOKEN}", "also the token of 'vera'"), (f"bad name:viewer={TOKEN}", "entry 1"),
    ("vera:viewer", "entry 1")])
def test_bad_token_entries_are_refused_without_echoing_a_token(text, fragment):
    with pytest.raises(ValueError, match=fragment) as e:
        parse_control_tokens(text, "control.tokens_file /x")
    assert TOKEN not in str(e.value) and "control.tokens_file /x" in str(e.value)


def test_roles_are_ordered():
    assert ROLES == ("viewer", "operator", "admin")
    assert Identity("a", "admin").allows("operator") and Identity("o", "operator").allows("viewer")
    assert not Identity("v", "viewer").allows("operator") and not Identity("o", "operator").allows("admin")


def test_a_watched_file_is_reread_when_it_changes_and_fails_closed_when_broken(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("one")
    now = [0.0]
    w = WatchedFile(str(f), lambda t: t.upper(), reload_s=5, clock=lambda: now[0])
    assert w.value() == "ONE"
    f.write_text("two!")
    assert w.value() == "ONE"  # not checked again within reload_s
    now[0] = 5.0
    assert w.value() == "TWO!"
    w.parse = lambda t: (_ for _ in ()).throw(ValueError("malformed"))
    f.write_text("three")
    now[0] = 10.0
    with pytest.raises(ValueError, match="malformed"):
        w.value()
    os.remove(f)
    now[0] = 15.0
    with pytest.raises(ValueError, match="cannot be read"):
        w.value()


def test_settings_refuse_a_jwt_issuer_without_keys_or_audience():
    with pytest.raises(ValidationError, match="jwks_url nor control.jwt.jwks_file"):
        MascotConfig(control={"jwt": {"issuer": "https://idp/", "audience": "a"}})
    with pytest.raises(ValidationError, match="without control.jwt.audience"):
        MascotConfig(control={"jwt": {"issuer": "https://idp/", "jwks_url": "https://idp/jwks"}})
    with pytest.raises(ValidationError):
        MascotConfig(control={"jwt": {"algorithms": ["none"]}})
    c = MascotConfig().control
    assert (c.host, c.port, c.reflection) == ("127.0.0.1", 50061, False)


def test_from_config_reads_the_file_the_variable_and_the_legacy_token(tmp_path):
    f = tmp_path / "t"
    f.write_text(f"vera:viewer={TOKEN}\n")
    cfg = MascotConfig(control={"tokens_file": str(f)}, adapters={"admin_token_env": "LEGACY"})
    auth = ControlAuth.from_config(cfg, environ={})
    assert auth.configured and auth.legacy_token == ""
    f.write_text("vera:nobody=" + TOKEN)
    with pytest.raises(ValueError, match="role 'nobody'"):  # a bad file fails the start
        ControlAuth.from_config(cfg, environ={})
    cfg = MascotConfig(adapters={"admin_token_env": "MASCOT_TEST_LEGACY_ADMIN"})
    os.environ["MASCOT_TEST_LEGACY_ADMIN"] = "legacy-admin-token-0123"
    try:
        assert ControlAuth.from_config(cfg, environ={"MASCOT_CONTROL_TOKENS": f"otto:operator={TOKEN}"}).configured
        assert not ControlAuth(None).configured
    finally:
        del os.environ["MASCOT_TEST_LEGACY_ADMIN"]


def test_the_store_url_can_come_from_a_file(tmp_path):
    f = tmp_path / "url"
    f.write_text("postgresql+psycopg://u:pw@db/mascot\n")
    assert MascotConfig(store={"url_file": str(f)}).store.resolved_url() == "postgresql+psycopg://u:pw@db/mascot"
    f.write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        MascotConfig(store={"url_file": str(f)}).store.resolved_url()
    with pytest.raises(ValueError, match="cannot be read") as e:
        MascotConfig(store={"url_file": str(tmp_path / "none")}).store.resolved_url()
    assert "pw" not in str(e.value)
