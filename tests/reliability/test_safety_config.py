"""Safety configuration leftovers found by a reviewer: the check-in turn did not list ``safety.resources`` (only the
crisis template did), and a retrained crisis detector could not be served without rebuilding the package (no setting
for its path). Real gateway, director and speaker servers on loopback where the gateway's behaviour is the subject
(a scripted engine; a stand-in sentence encoder where a detector file is served, so no MiniLM is loaded)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.app.stack import start_stack
from mascot.cli.safety import safety_app
from mascot.core.config import MascotConfig, SafetyConfig, load_config
from mascot.core.personas import PersonaCatalog
from mascot.core.server import channel
from mascot.gateway import crisis_model as cm
from mascot.gateway.safety import CHECKIN_ACTION, SAFETY_ACTION, TEMPLATES, SafetyGate
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

DIRECTOR = "Agent: The Catalyst\nAction: Ask one question.\nTone: Curious"
RESOURCES = ["In Australia, call Lifeline on 13 11 14.", "Or text a friend you trust and tell them."]
#: A Spanish despair phrase: the lexicons' check-in tier, also with the rules-only gate the test stacks use.
CHECK_IN_MESSAGE = "ya no puedo más con todo esto"


def _engine() -> ScriptedEngine:
    return ScriptedEngine(lambda p: DIRECTOR, lambda p: "A reply.")


def _agent_turns(events):
    return [e.turn_completed.turn for e in events if e.HasField("turn_completed")
            and e.turn_completed.turn.role == dpb.ROLE_AGENT]


async def _send(stack, text: str):
    async with channel(stack.target("gateway")) as ch:
        stub = cpb_grpc.ConversationServiceStub(ch)
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        return await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text=text,
                                                                     idempotency_key="k1")))


# ------------------------------------------------------------------ (a) the check-in turn lists the resources
@pytest.mark.integration
async def test_the_check_in_turn_lists_the_configured_resources(tmp_path):
    stack = await start_stack(make_config(tmp_path, safety={"resources": RESOURCES}), engine=_engine())
    try:
        events = await _send(stack, CHECK_IN_MESSAGE)
    finally:
        await stack.stop(0)
    check_in = _agent_turns(events)[0]
    assert check_in.safety and check_in.directive.action == CHECKIN_ACTION
    assert check_in.text == TEMPLATES["en"].check_in + "\n\n" + "\n".join(RESOURCES)  # as the crisis template does
    assert "988" not in check_in.text  # the configured lines replace the locale's, as on the crisis tier
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED


def test_the_check_in_text_lists_the_locale_lines_without_configuration_and_after_a_follow_up(tmp_path):
    catalog = PersonaCatalog.load()
    text = SafetyGate(SafetyConfig(classifier="none"), catalog).check_in_text()
    assert text.startswith("Before we go on, I want to check in with you")
    assert text.endswith("\n\n" + "\n".join(TEMPLATES["en"].resources)) and "988" in text and "116 123" in text
    f = tmp_path / "t.yaml"  # a locale without a check_in line: its follow_up, then its resources
    f.write_text("de:\n  acknowledge: Danke.\n  emergency: Im Notfall ruf 112 an.\n  resources: [TelefonSeelsorge "
                 "0800 111 0 111.]\n  encourage: Sprich mit jemandem.\n  follow_up: Wie geht es dir gerade?\n")
    gate = SafetyGate(SafetyConfig(classifier="none", locale="de", templates_file=f), catalog)
    assert gate.check_in_text() == "Wie geht es dir gerade?\n\nTelefonSeelsorge 0800 111 0 111."


# ------------------------------------------------------------------ (b) safety.detector_path
class ZeroEncoder:
    """A stand-in sentence encoder (no MiniLM): every text embeds to zeros, so the TF-IDF part decides."""

    def embed(self, texts):
        return np.zeros((len(texts), 384), dtype=np.float32)


@pytest.fixture
def alarmist(tmp_path, monkeypatch):
    """A retrained detector file that puts every readable message in the crisis tier (risk intercept +30), without an
    encoder adapter, so served with the stand-in encoder; the shared classifiers are dropped afterwards."""
    monkeypatch.setattr(cm, "shared_encoder", lambda: ZeroEncoder())
    det = cm.Detector.load()
    path = tmp_path / "retrained.json"
    plain = det.settings.model_copy(update={"adapter": "", "adapter_sha256": ""})
    det.model_copy(update={"risk_intercept": 30.0, "settings": plain}).save(path)
    cm.shared_classifier.cache_clear()
    yield path
    cm.shared_classifier.cache_clear()


@pytest.mark.integration
async def test_the_gateway_serves_the_detector_named_by_safety_detector_path(tmp_path, alarmist):
    stack = await start_stack(make_config(tmp_path, safety={"classifier": "minilm",
                                                            "detector_path": str(alarmist)}), engine=_engine())
    try:
        events = await _send(stack, "I had a lovely lunch with my sister today.")
    finally:
        await stack.stop(0)
    turns = _agent_turns(events)
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY  # only that file says so
    assert len(turns) == 1 and turns[0].directive.action == SAFETY_ACTION


def test_the_detector_path_is_the_shipped_file_when_empty(alarmist):
    gate = SafetyGate(SafetyConfig(), PersonaCatalog.load())
    assert gate.classifier.detector.model_dump() == cm.Detector.load(cm.DETECTOR_FILE).model_dump()  # cache aside
    gate = SafetyGate(SafetyConfig(detector_path=str(alarmist)), PersonaCatalog.load())
    assert gate.classifier.detector.risk_intercept == 30.0


def test_a_missing_or_unreadable_detector_path_is_refused_when_the_config_loads(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"safety.detector_path .*nope.json does not exist; write one with "
                                         r"`mascot safety train --out FILE`"):
        SafetyConfig(detector_path=str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match="safety.detector_path .* is a directory"):
        SafetyConfig(detector_path=str(tmp_path))
    monkeypatch.setenv("MASCOT_SAFETY__DETECTOR_PATH", str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match=r"detector_path\n.*safety.detector_path .*nope.json does not exist"):
        load_config()
    monkeypatch.setenv("MASCOT_SAFETY__DETECTOR_PATH", "")
    assert MascotConfig().safety.detector_path == ""


def test_a_detector_file_that_is_not_a_detector_is_refused_at_start_naming_it(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"settings": {}}))
    with pytest.raises(ValueError) as err:
        SafetyGate(SafetyConfig(detector_path=str(bad)), PersonaCatalog.load())
    assert str(err.value) == (f"crisis detector {bad} is not a detector file (vocabulary: Field required and 5 more "
                              "problem(s)); rebuild it with `mascot safety train` (safety.detector_path names the file "
                              "the gateway loads)")


def test_the_safety_cli_says_how_to_serve_a_retrained_detector_and_takes_it(tmp_path):
    from mascot.cli.safety import serving_hint

    other = tmp_path / "det.json"
    hint = serving_hint(other, cm.DETECTOR_FILE)
    assert f"set safety.detector_path: {other}" in hint and f"MASCOT_SAFETY__DETECTOR_PATH={other}" in hint
    assert "restart the gateway" in hint
    assert "safety.detector_path is empty" in serving_hint(cm.DETECTOR_FILE, cm.DETECTOR_FILE)
    out = CliRunner().invoke(safety_app, ["check", "--detector", str(tmp_path / "nope.json"), "hello"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 1 and "safety.detector_path" in out.output and "does not exist" in out.output
