"""The model drives the director: a tiny LoRA trained for a few steps to prefer one persona makes it the
director's raw choice (before the cap), through the real DirectorService."""

import random

import pytest

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.director.v1 import director_pb2 as pb
from mascot.api.director.v1 import director_pb2_grpc as pb_grpc
from mascot.core.dialogue import HistoryTurn
from mascot.core.engine.transformers import TransformersEngine
from mascot.core.personas import PersonaCatalog
from mascot.core.server import channel
from mascot.director.prompts import build_messages
from mascot.app.stack import start_stack
from tests.helpers.config import make_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CAT = PersonaCatalog.load()
ROSTER = CAT.in_set("support")
UTTERANCES = ["I failed my exam.", "My sister is getting married!", "I can't sleep at night.", "I got a new job.",
              "My cat is sick.", "I'm moving abroad next week.", "Nobody called me on my birthday.",
              "I finished my first marathon.", "My boss yelled at me.", "I'm nervous about the interview."]


def histories(seed, n):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        h = [HistoryTurn("user", rng.choice(UTTERANCES))]
        for _ in range(rng.randint(0, 2)):
            h.append(HistoryTurn("agent", rng.choice(UTTERANCES), rng.choice(["anchor", "catalyst"])))
        out.append(h)
    return out


def train_director_adapter(model_dir, out_dir, target="The Beacon", steps=40):
    """A few SFT steps of a LoRA on director prompts whose answer names ``target``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    answer = f"Agent: {target}\nAction: Celebrate the user's strengths.\nTone: Warm"
    samples = []
    for h in histories(1, 12):
        prompt = tok.apply_chat_template(build_messages(ROSTER, h, [], 2), tokenize=False, add_generation_prompt=True)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        samples.append((torch.tensor([p_ids + a_ids]), torch.tensor([[-100] * len(p_ids) + a_ids])))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    model.train()
    for step in range(steps):
        ids, labels = samples[step % len(samples)]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out_dir)
    return out_dir


async def test_trained_director_adapter_drives_the_choice(tiny_model_dir, tmp_path):
    adapter = train_director_adapter(tiny_model_dir, tmp_path / "director--v1")
    eng = TransformersEngine(str(tiny_model_dir), adapters={"director--v1": str(adapter)})
    await eng.start()
    stack = await start_stack(make_config(tmp_path, director={"adapter": "director--v1"}), ("director",), engine=eng)
    try:
        async with channel(stack.target("director")) as ch:
            stub = pb_grpc.DirectorServiceStub(ch)
            choices, sources = [], []
            for h in histories(2, 10):  # held-out histories
                resp = await stub.NextDirective(pb.NextDirectiveRequest(
                    persona_ids=[c.id for c in ROSTER],
                    history=[dpb.Turn(role=dpb.ROLE_USER if t.role == "user" else dpb.ROLE_AGENT,
                                      persona_id=t.persona_id, text=t.text) for t in h]))
                choices.append(resp.model_choice)
                sources.append(resp.directive.source)
                assert resp.adapter_version == "director--v1"
        share = choices.count("beacon") / len(choices)
        assert share >= 0.8, choices
        assert sources.count(dpb.DIRECTIVE_SOURCE_MODEL) >= 8
        # without the adapter the base model is not biased the same way: the choice really comes from the LoRA
        stack2 = await start_stack(make_config(tmp_path / "base"), ("director",), engine=eng)
        async with channel(stack2.target("director")) as ch:
            stub = pb_grpc.DirectorServiceStub(ch)
            base = [(await stub.NextDirective(pb.NextDirectiveRequest(persona_ids=[c.id for c in ROSTER], history=[
                dpb.Turn(role=dpb.ROLE_USER, text=h[0].text)]))).model_choice for h in histories(2, 10)]
        await stack2.stop(0)
        assert base.count("beacon") < 8, base
    finally:
        await stack.stop(0)
        await eng.close()
