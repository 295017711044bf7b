"""``server.keepalive_*`` / ``server.max_connection_age*``: ranges, the grace rule, and the gRPC arguments servers and
channels get from them (behaviour against real servers: tests/integration/test_grpc_balancing.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from mascot.core.config import MascotConfig, ServerConfig
from mascot.core.server import DEFAULT_KEEPALIVE_TIME_S, LOAD_BALANCING, ConnectionSettings


def test_defaults_are_the_configs():
    assert ConnectionSettings() == ConnectionSettings.from_config(ServerConfig())
    assert ConnectionSettings().keepalive_time_s == DEFAULT_KEEPALIVE_TIME_S
    assert LOAD_BALANCING == json.loads('[{"round_robin": {}}]')


@pytest.mark.parametrize("field, value", [
    ("keepalive_time_s", 0.5), ("keepalive_time_s", 7201), ("keepalive_timeout_s", 0), ("max_connection_age_s", -1),
    ("max_connection_age_s", 86401), ("max_connection_age_grace_s", 0.5),
])
def test_out_of_range_values_are_refused(field, value):
    with pytest.raises(ValidationError, match=field):
        MascotConfig(server={field: value})


def test_the_grace_covers_a_calls_deadline_unless_connections_never_age():
    with pytest.raises(ValidationError, match="max_connection_age_grace_s .* at least server.call_timeout_s"):
        ServerConfig(call_timeout_s=900)
    assert ServerConfig(call_timeout_s=900, max_connection_age_grace_s=900).max_connection_age_s == 300
    assert ServerConfig(call_timeout_s=900, max_connection_age_s=0).call_timeout_s == 900


# (server's keepalive_time_s, client's): the same setting, a client on the defaults (30 s), a slower client, and a
# faster one (a per-component config may set the client side alone), down to the smallest the config allows
@pytest.mark.parametrize("server_ka, client_ka", [(30, 30), (1, 1), (600, 30), (30, 600), (10, 10), (7200, 30),
                                                  (30, 10), (7200, 1)])
def test_servers_accept_the_pings_of_every_client_the_config_allows(server_ka, client_ka):
    """A server refuses pings closer than grpc.http2.min_ping_interval_without_data_ms: 0.5 s, whatever its own
    keepalive_time_s, so never above half the interval of any client the config allows."""
    server = dict(ConnectionSettings(keepalive_time_s=server_ka).server_options())
    client = dict(ConnectionSettings(keepalive_time_s=client_ka).client_options())
    assert server["grpc.keepalive_permit_without_calls"] == client["grpc.keepalive_permit_without_calls"] == 1
    # half the client's interval at most: a ping the client's timer sends early is still no strike
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= client["grpc.keepalive_time_ms"] / 2
    assert client["grpc.http2.max_pings_without_data"] == 0


def test_max_connection_age_options_and_off():
    on = dict(ConnectionSettings(max_connection_age_s=2.5, max_connection_age_grace_s=7).server_options())
    assert (on["grpc.max_connection_age_ms"], on["grpc.max_connection_age_grace_ms"]) == (2500, 7000)
    off = dict(ConnectionSettings(max_connection_age_s=0).server_options())
    assert "grpc.max_connection_age_ms" not in off and "grpc.max_connection_age_grace_ms" not in off
