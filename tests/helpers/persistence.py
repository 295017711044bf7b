"""Crash safety of the gateway: an acknowledged turn survives SIGKILL of a real ``mascot serve`` process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.server import channel
from mascot.gateway.store import Store


async def start_server(model_dir, db_url, tmp_path):
    """``mascot serve`` on ``model_dir`` and the store at ``db_url`` in a subprocess (its stderr appended to
    ``tmp_path``/server.log); returns (process, gateway port) once it printed its ready line."""
    env = {**os.environ, "MASCOT_ENGINE__MODEL": str(model_dir), "PYTHONUNBUFFERED": "1",
           "MASCOT_SERVER__METRICS_PORT": "0"}  # a free port: 9464 may be taken by another server
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mascot.cli", "serve", "--port", "0", "--store-url", db_url,
        stdout=subprocess.PIPE, stderr=open(tmp_path / "server.log", "ab"), env=env, cwd=tmp_path)  # kept for failures
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert line, "server exited before it was ready"
        if line.startswith(b"{"):
            return proc, json.loads(line)["gateway"]


async def check_sigkill_and_resume(tiny_model_dir, tmp_path, db):
    """SIGKILL the gateway right after the first acknowledged agent turn; the turn is stored; a restarted gateway
    finishes the round on a retry with the same key, nothing duplicated (the store at ``db``: SQLite or PostgreSQL)."""
    proc, port = await start_server(tiny_model_dir, db, tmp_path)
    acked = None
    try:
        async with channel(f"127.0.0.1:{port}") as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
            call = stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="I miss my grandmother.",
                                                           idempotency_key="round-1"))
            async for r in call:
                if r.event.HasField("turn_completed"):
                    acked = r.event.turn_completed.turn
                    proc.send_signal(signal.SIGKILL)  # kill right after the first acknowledged agent turn
                    break
            call.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL and acked is not None
    store = Store(db)
    conv_row, turns = store.get_conversation(conv.id)
    assert turns[acked.index].text == acked.text and turns[acked.index].persona_id == acked.persona_id
    assert store.get_round(conv.id, "round-1").state == "running"
    store.close()

    proc, port = await start_server(tiny_model_dir, db, tmp_path)
    try:
        async with channel(f"127.0.0.1:{port}") as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            events = [r.event async for r in stub.SendMessage(cpb.SendMessageRequest(
                conversation_id=conv.id, text="I miss my grandmother.", idempotency_key="round-1"))]
            assert events[0].round_started.replayed
            assert events[-1].round_completed.agent_turns == 3
            got = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))
            texts = [t.text for t in got.conversation.turns]
            assert len(texts) == 4 and acked.text in texts  # one user turn + 3 agent turns, nothing duplicated
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0
