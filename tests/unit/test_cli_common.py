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


def test_a_promote_that_outlives_its_timeout_says_what_happened_and_what_to_change(monkeypatch):
    """A gateway whose evaluation gate takes longer than ``--timeout`` (a real gRPC server on loopback that
    answers PromoteAdapter after 3 s): exit 1, the status, and the hint (nothing promoted, raise --timeout)."""
    import time
    from concurrent import futures

    import grpc
    from typer.testing import CliRunner

    from mascot.api.adapter.v1 import adapter_pb2 as pb
    from mascot.api.adapter.v1 import adapter_pb2_grpc
    from mascot.cli.main import app

    class SlowGate(adapter_pb2_grpc.AdapterServiceServicer):
        def PromoteAdapter(self, request, context):
            time.sleep(3.0)
            return pb.PromoteAdapterResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    adapter_pb2_grpc.add_AdapterServiceServicer_to_server(SlowGate(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", "t0ken")
    try:
        r = CliRunner().invoke(app, ["adapters", "promote", "anchor", "1", "--timeout", "1",
                                     "--target", f"127.0.0.1:{port}"])
    finally:
        server.stop(0)
    out = " ".join(r.output.split())
    assert r.exit_code == 1, r.output
    assert "DEADLINE_EXCEEDED" in out and "no answer within --timeout 1 s" in out and "most likely not promoted" in out
    assert "raise --timeout" in out


def test_the_choice_types_of_the_options_equal_what_the_services_accept():
    from typing import get_args

    from mascot.api.training.v1 import training_pb2 as tpb
    from mascot.cli.common import EngineKind, ModeName, PhaseName
    from mascot.core.config import EngineConfig
    from mascot.core.enums import enum_names
    from mascot.core.situations import MODES

    assert list(get_args(ModeName)) == list(MODES)
    assert get_args(EngineKind) == get_args(EngineConfig.model_fields["kind"].annotation)
    assert list(get_args(PhaseName)) == list(enum_names(tpb.TrainingPhase, sep="-"))


def test_a_mistyped_choice_is_refused_with_the_choices_listed():
    from typer.testing import CliRunner

    from mascot.cli import app

    for args in (["run", "--mode", "chat"], ["serve", "--engine", "vllm-gpu"], ["retrain", "list", "--phase", "p1"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "is not one of" in r.output, (args, r.output)
    assert "<support|meeting>" in CliRunner().invoke(app, ["eval", "--help"], terminal_width=200).output
    from mascot.app.stack import MODEL_COMPONENTS

    usage = CliRunner().invoke(app, ["serve-model", "--help"], terminal_width=200).output
    assert "|".join(MODEL_COMPONENTS) + "[,...]" in usage, usage  # the component argument names its choices
