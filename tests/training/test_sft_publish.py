"""SFT stage, publish gate and the atomic adapter store, with real TRL/PEFT on a tiny Qwen3.

Why the test base is "sharpened": a random-init tiny Qwen3 cannot collapse. Its logits are the final RMSNorm output
(norm about sqrt(hidden) = 8, norm weights 1) dotted with tied embedding rows of std 0.02 (norm about 0.16), so
every logit lies within about +-1.3 and sampling at T 0.7 is near-uniform over ~1,200 tokens whatever a LoRA does
(a 40-step LoRA trained on "yes yes ..." still gave p(next) <= 4% and distinct-2 = 1.0). Scaling the final norm makes
the random base itself loop. So the module fixture trains the tiny base on its own tokenizer corpus for 100 steps
(~3 s): embeddings of frequent tokens grow, the base samples varied text, and a LoRA trained at a high rate to repeat
the frequent token " the" really collapses. The gate then computes real metrics from real generations: the healthy
(smoke-SFT) adapter passes and the collapsed one fails with the same default thresholds.

torch runs on one thread in this module: on the shared 2-core machine two OpenMP threads made each tiny step ~20x
slower (spin-waiting under oversubscription).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from mascot.core.adapters import store as adapter_store
from mascot_training.common import lora, publish
from mascot_training.persona import publish_personas, sft
from mascot_training.persona.config import GateConfig, PersonaAlignmentConfig

pytestmark = pytest.mark.slow

# the tiny random model's text repeats 4-grams by nature (half its "healthy" replies loop): the loop and echo
# limits are tested on planted replies (test_phase1_logic); here the gate's collapse checks are
GATE = {"prompts": 4, "max_tokens": 24, "max_loop_rate": 1.0, "max_echo_rate": 1.0}


def _personas() -> list[str]:
    from mascot.core.personas import PersonaCatalog

    return [c.id for c in PersonaCatalog.load().in_set("support")][:2]


def _sharpen_base(base: Path, steps: int = 100, lr: float = 3e-3) -> None:
    """Full-train the tiny base on its tokenizer corpus so that a LoRA can change its outputs (module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mascot.core.engine.tiny import training_corpus

    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    ids = tok("\n".join(training_corpus()), add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    chunks = ids[: len(ids) // 64 * 64].view(-1, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        b = chunks[torch.randint(0, len(chunks), (16,), generator=g)]
        model(input_ids=b, labels=b).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(base)


@pytest.fixture(scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def base(tmp_path_factory, one_thread) -> str:
    from mascot.core.engine.tiny import build_tiny_qwen3

    d = build_tiny_qwen3(tmp_path_factory.mktemp("sftbase") / "model")
    _sharpen_base(d)
    return str(d)


def _cfg(**kw) -> PersonaAlignmentConfig:
    return PersonaAlignmentConfig(personas=_personas(), **kw)


@pytest.fixture(scope="module")
def healthy(base, tmp_path_factory) -> tuple[Path, dict]:
    """Smoke SFT (persona-card set, 2 steps): ``(run out dir, manifest)``."""
    out = tmp_path_factory.mktemp("sft_out")
    cfg = _cfg(sft={"enabled": True, "max_steps": 2, "batch_size": 2}, lora={"r": 4, "alpha": 8})
    m = sft.run(cfg, out, base_model=base)
    return out, m


@pytest.fixture(scope="module")
def collapsed(base, tmp_path_factory) -> Path:
    """A LoRA trained at a high rate to answer every message with " the" x 12 (through the SFT stage)."""
    from mascot.core.personas import PersonaCatalog
    from mascot.speaker.prompts import persona_system_prompt

    d = tmp_path_factory.mktemp("collapse")
    card = PersonaCatalog.load().get(_personas()[1])
    rows = [{"persona_id": card.id, "messages": [{"role": "system", "content": persona_system_prompt(card)},
                                                 {"role": "user", "content": msg},
                                                 {"role": "assistant", "content": " ".join(["the"] * 12)}]}
            for msg in lora.STOCK_MESSAGES]
    (d / "collapse.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = _cfg(sft={"enabled": True, "max_steps": 60, "batch_size": 4, "lr": 6e-2, "data": d / "collapse.jsonl"},
               lora={"r": 8, "alpha": 16, "dropout": 0.0})
    m = sft.run(cfg, d / "out", base_model=base)
    assert m["metrics"]["rows"] == 4 and m["data_ids"][0] == "collapse.jsonl:1"
    return d / "out" / "sft" / "adapter"


def _tree(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*"))


def _publish(store: Path, pid: str, adapter: Path, base: str, **kw) -> dict:
    return publish.publish_adapter(store, pid, adapter, base_model=base, run_id="t1", data_ids=["d1", "d2"],
                                   eval_metrics={"gate": {"passed": True}}, **kw)


# ------------------------------------------------------------------------------------------------------------ SFT


def test_sft_disabled_returns_none(tmp_path):
    assert sft.run(_cfg(), tmp_path, base_model="unused") is None
    assert not (tmp_path / "sft").exists()


def test_sft_smoke_writes_loadable_lora_only_adapter(base, healthy):
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out, m = healthy
    adapter = out / "sft" / "adapter"
    assert m["metrics"]["steps"] == 2 and m["metrics"]["rows"] == 3 * len(_personas())
    assert m["metrics"]["train_loss"] > 0 and m["inputs"]["data"] == "smoke"
    assert (out / "sft" / "manifest.json").is_file() and not (out / "sft.partial").exists()
    conf = json.loads((adapter / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == base and conf["r"] == 4 and not conf.get("modules_to_save")
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all("lora_" in k for k in keys)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter))
    assert any("lora_A" in n for n, _ in model.named_parameters())


def test_sft_resume_is_a_noop(base, healthy):
    out, m = healthy
    st = (out / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns
    t = time.monotonic()
    cfg = _cfg(sft={"enabled": True, "max_steps": 2, "batch_size": 2}, lora={"r": 4, "alpha": 8})
    again = sft.run(cfg, out, base_model=base)
    assert time.monotonic() - t < 2.0
    assert again == json.loads((out / "sft" / "manifest.json").read_text())
    assert again["metrics"] == m["metrics"]
    assert (out / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns == st


def test_per_persona_sft_trains_one_adapter_each_and_a_killed_stage_keeps_the_finished_ones(base, tmp_path,
                                                                                            monkeypatch):
    from safetensors.torch import load_file

    p0, p1 = _personas()
    cfg = _cfg(sft={"enabled": True, "max_steps": 2, "batch_size": 2, "per_persona": True}, lora={"r": 4, "alpha": 8})
    real = sft._train_adapter

    def dies_on_second(cfg_, rows, base_model, dest, work, curves, label):
        if label == p1:
            raise RuntimeError("killed")
        return real(cfg_, rows, base_model, dest, work, curves, label)

    monkeypatch.setattr(sft, "_train_adapter", dies_on_second)
    with pytest.raises(RuntimeError, match="killed"):
        sft.run(cfg, tmp_path, base_model=base)
    assert not (tmp_path / "sft").exists()  # nothing published by a killed stage
    first = tmp_path / "sft.partial" / "adapters" / p0 / "adapter_model.safetensors"
    st = first.stat().st_mtime_ns
    trained = []
    monkeypatch.setattr(sft, "_train_adapter", lambda *a: trained.append(a[-1]) or real(*a))
    m = sft.run(cfg, tmp_path, base_model=base)
    assert trained == [p1]  # the rerun trained only the persona the killed run had not finished
    assert (tmp_path / "sft" / "adapters" / p0 / "adapter_model.safetensors").stat().st_mtime_ns == st
    assert m["adapters"] == {p0: f"adapters/{p0}", p1: f"adapters/{p1}"}
    assert m["metrics"]["per_persona"][p0]["rows"] == m["metrics"]["per_persona"][p1]["rows"] == 3
    dirs = sft.adapter_dirs(tmp_path, [p0, p1])
    assert dirs == {p: tmp_path / "sft" / "adapters" / p for p in (p0, p1)}
    w0, w1 = (load_file(dirs[p] / "adapter_model.safetensors") for p in (p0, p1))
    assert any(not torch.equal(w0[k], w1[k]) for k in w0 if "lora_B" in k)  # each learnt its own rows
    with pytest.raises(ValueError, match="no adapter for persona"):
        sft.adapter_dirs(tmp_path, [p0, "beacon"])


def test_per_persona_sft_retrains_only_the_persona_whose_rows_changed(base, tmp_path, monkeypatch):
    p0, p1 = _personas()

    def row(pid, reply):
        return json.dumps({"persona_id": pid, "messages": [{"role": "user", "content": "I lost my keys."},
                                                           {"role": "assistant", "content": reply}]}) + "\n"

    data = tmp_path / "rows.jsonl"
    data.write_text(row(p0, "That is annoying.") + row(p1, "Check your coat pockets tonight."))
    cfg = _cfg(sft={"enabled": True, "max_steps": 1, "per_persona": True, "data": data}, lora={"r": 4, "alpha": 8})
    first = sft.run(cfg, tmp_path / "out", base_model=base)
    kept = (tmp_path / "out" / "sft" / "adapters" / p0 / "adapter_model.safetensors").read_bytes()
    # the same run directory, new rows for p1: the finished stage's p0 adapter is reused, p1 retrained
    data.write_text(row(p0, "That is annoying.") + row(p1, "Call the last shop you visited tomorrow."))
    real, trained = sft._train_adapter, []
    monkeypatch.setattr(sft, "_train_adapter", lambda *a: trained.append(a[-1]) or real(*a))
    m = sft.run(cfg, tmp_path / "out", base_model=base)
    assert trained == [p1] and set(m["adapters"]) == {p0, p1}
    assert m["inputs"]["data"] != first["inputs"]["data"]  # a new stage, not the old one returned
    assert (tmp_path / "out" / "sft" / "adapters" / p0 / "adapter_model.safetensors").read_bytes() == kept
    assert m["metrics"]["per_persona"][p0] == first["metrics"]["per_persona"][p0]


def test_per_persona_sft_refuses_a_persona_without_rows(base, tmp_path):
    p0, p1 = _personas()
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"persona_id": p0, "messages": [{"role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": "hello"}]}) + "\n")
    cfg = _cfg(sft={"enabled": True, "max_steps": 1, "per_persona": True, "data": rows})
    with pytest.raises(ValueError, match=f"no SFT rows for persona\\(s\\) \\['{p1}'\\]"):
        sft.run(cfg, tmp_path / "out", base_model=base)


def test_shared_sft_adapter_serves_every_persona(healthy):
    out, _ = healthy
    assert sft.adapter_dirs(out, _personas()) == {p: out / "sft" / "adapter" for p in _personas()}
    assert sft.adapter_dirs(out / "nothing", _personas()) is None


@pytest.mark.parametrize("line, why", [
    ("{not json", "not valid JSON"),
    ('{"persona_id": "P", "messages": [{"role": "user", "content": "hi"}]}', "at least two"),
    ('{"persona_id": "P", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "x"}]}',
     "last message must be the assistant"),
    ('{"persona_id": "P", "messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}]}',
     "role"),
    ('{"persona_id": "nobody", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
     '"content": "x"}]}', "unknown persona_id"),
    ('{"persona_id": "P", "extra": 1, "messages": []}', "unknown key"),
])
def test_sft_bad_data_line_names_file_and_line(tmp_path, line, why):
    pid = _personas()[0]
    good = {"persona_id": pid, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps(good) + "\n\n" + line.replace('"P"', f'"{pid}"') + "\n", encoding="utf-8")
    cfg = _cfg(sft={"enabled": True, "data": data})
    with pytest.raises(ValueError, match=rf"sft\.jsonl:3: .*{why}"):
        sft.run(cfg, tmp_path / "out", base_model="never-loaded")
    assert not (tmp_path / "out" / "sft").exists()


# ------------------------------------------------------------------------------------------------------ publish


def test_publish_v1_then_v2_staged_with_revisions(base, healthy, tmp_path):
    adapter = healthy[0] / "sft" / "adapter"
    store, pid = tmp_path / "store", _personas()[0]
    r1 = _publish(store, pid, adapter, base)
    assert (r1["version"], r1["name"], r1["revision"]) == (1, f"{pid}--v1", 1)
    r2 = _publish(store, pid, adapter, base)
    assert (r2["version"], r2["name"], r2["revision"]) == (2, f"{pid}--v2", 2)
    reg = json.loads((store / "registry.json").read_text())
    assert reg["revision"] == 2
    entry = reg["adapters"][pid]
    assert entry["stable"] is None and entry["canary"] is None and entry["canary_weight"] == 0
    assert {k: v["state"] for k, v in entry["versions"].items()} == {"1": "staged", "2": "staged"}
    assert entry["versions"]["2"]["name"] == f"{pid}--v2"
    man = json.loads((store / pid / "v2" / "manifest.json").read_text())
    assert man["digest"] == publish.file_digest(adapter / "adapter_model.safetensors") == r2["digest"]
    assert (man["base_model"], man["rank"], man["run_id"], man["data_ids"]) == (base, 4, "t1", ["d1", "d2"])
    assert man["eval_metrics"] == {"gate": {"passed": True}} and man["created"].endswith("Z")
    assert {p.name for p in (store / pid / "v1").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors",
                                                                "manifest.json"}
    assert _tree(store).count("registry.lock") == 0 and not list(store.rglob("*.tmp-*"))


def _seeded_store(base, healthy, tmp_path) -> tuple[Path, str, bytes, list[str]]:
    store, pid = tmp_path / "store", _personas()[0]
    _publish(store, pid, healthy[0] / "sft" / "adapter", base)
    return store, pid, (store / "registry.json").read_bytes(), _tree(store)


def _edited_copy(adapter: Path, tmp_path: Path, **conf_changes) -> Path:
    d = tmp_path / "edited"
    shutil.copytree(adapter, d)
    conf = json.loads((d / "adapter_config.json").read_text())
    conf.update(conf_changes)
    (d / "adapter_config.json").write_text(json.dumps(conf))
    return d


@pytest.mark.parametrize("change, kw, message", [
    ({"base_model_name_or_path": "Qwen/Qwen3-8B"}, {}, r"trained on base model 'Qwen/Qwen3-8B'.*retrain"),
    ({}, {"max_rank": 2}, r"LoRA rank 4, above the serving limit adapters.max_rank 2"),
    ({"modules_to_save": ["lm_head"]}, {}, r"full-weight modules \['lm_head'\]"),
])
def test_publish_refusals_leave_store_untouched(base, healthy, tmp_path, change, kw, message):
    store, pid, reg, tree = _seeded_store(base, healthy, tmp_path)
    adapter = _edited_copy(healthy[0] / "sft" / "adapter", tmp_path, **change)
    with pytest.raises(publish.PublishError, match=message):
        _publish(store, pid, adapter, base, **kw)
    assert (store / "registry.json").read_bytes() == reg and _tree(store) == tree


def test_publish_refuses_non_lora_tensors(base, healthy, tmp_path):
    from safetensors.torch import load_file, save_file

    store, pid, reg, tree = _seeded_store(base, healthy, tmp_path)
    adapter = _edited_copy(healthy[0] / "sft" / "adapter", tmp_path)
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    tensors["base_model.model.model.embed_tokens.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(publish.PublishError, match="non-LoRA tensor"):
        _publish(store, pid, adapter, base)
    assert (store / "registry.json").read_bytes() == reg and _tree(store) == tree


def test_corrupt_copy_leaves_nothing(base, healthy, tmp_path, monkeypatch):
    store, pid, reg, tree = _seeded_store(base, healthy, tmp_path)
    real = shutil.copytree

    def corrupting(src, dst, **kw):
        out = real(src, dst, **kw)
        with open(Path(dst) / "adapter_model.safetensors", "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([last[0] ^ 0xFF]))
        return out

    monkeypatch.setattr(adapter_store.shutil, "copytree", corrupting)
    with pytest.raises(publish.PublishError, match="copy is corrupt"):
        _publish(store, pid, healthy[0] / "sft" / "adapter", base)
    assert (store / "registry.json").read_bytes() == reg and _tree(store) == tree
    # A new persona's folder is not left behind either.
    with pytest.raises(publish.PublishError):
        _publish(store, _personas()[1], healthy[0] / "sft" / "adapter", base)
    assert _tree(store) == tree


def test_registry_write_failure_removes_the_new_version(base, healthy, tmp_path, monkeypatch):
    store, pid, reg, tree = _seeded_store(base, healthy, tmp_path)
    real = adapter_store.atomic_write_text

    def failing(path, text, *a, **kw):
        if Path(path).name == "registry.json":
            raise OSError("disk full")
        return real(path, text, *a, **kw)

    monkeypatch.setattr(adapter_store, "atomic_write_text", failing)
    with pytest.raises(OSError, match="disk full"):
        _publish(store, pid, healthy[0] / "sft" / "adapter", base)
    assert (store / "registry.json").read_bytes() == reg and _tree(store) == tree


def test_compare_and_swap_retries_when_the_registry_changes(base, healthy, tmp_path, monkeypatch):
    store, pid, _, _ = _seeded_store(base, healthy, tmp_path)
    real, calls = shutil.copytree, []

    def racing(src, dst, **kw):  # another writer (not taking the lock) bumps the revision once
        calls.append(dst)
        if len(calls) == 1:
            reg = json.loads((store / "registry.json").read_text())
            reg["revision"] += 10
            (store / "registry.json").write_text(json.dumps(reg))
        return real(src, dst, **kw)

    monkeypatch.setattr(adapter_store.shutil, "copytree", racing)
    r = _publish(store, pid, healthy[0] / "sft" / "adapter", base)
    assert len(calls) == 2 and (r["version"], r["revision"]) == (2, 12)
    assert json.loads((store / "registry.json").read_text())["revision"] == 12
    assert not list(store.rglob("*.tmp-*"))


def test_held_lock_times_out(tmp_path):
    (tmp_path / "registry.lock").write_text("1\n")
    with pytest.raises(publish.RegistryConflict, match="stayed locked"):
        with adapter_store.registry_lock(tmp_path, timeout_s=0.2):
            pass
    assert (tmp_path / "registry.lock").exists()  # someone else's lock is not removed


# --------------------------------------------------------------------------------------------------------- gate


def test_gate_passes_healthy_and_refuses_collapsed(base, healthy, collapsed):
    from mascot.core.personas import PersonaCatalog

    card = PersonaCatalog.load().get(_personas()[1])
    cfg = GateConfig(**GATE)
    ok = publish_personas.gate(base, healthy[0] / "sft" / "adapter", card, cfg)
    bad = publish_personas.gate(base, collapsed, card, cfg)
    assert ok["passed"] and ok["reason"] == "" and ok["replies"] == 4, ok
    assert ok["distinct_2"] >= cfg.min_distinct_2 and ok["mean_words"] >= cfg.min_mean_words
    assert not bad["passed"] and "distinct-2" in bad["reason"] and bad["distinct_2"] < 0.15, bad
    assert bad["distinct_2"] < ok["distinct_2"] / 3
    assert publish_personas.gate(base, collapsed, card, cfg) == bad  # seeded


def test_publish_stage_gates_each_persona_and_resumes(base, healthy, collapsed, tmp_path):
    p_ok, p_bad = _personas()
    cfg = _cfg(run_id="r1", publish={"gate": GATE})
    adapters = {p_ok: healthy[0] / "sft" / "adapter", p_bad: collapsed}
    m = publish_personas.run(cfg, tmp_path, base_model=base, adapters=adapters, data_ids=["s1"])
    store = tmp_path / "adapters"
    per = m["metrics"]["personas"]
    assert (m["metrics"]["published"], m["metrics"]["refused"]) == (1, 1)
    assert per[p_ok]["published"]["name"] == f"{p_ok}--v1" and per[p_ok]["gate"]["passed"]
    assert "gate: distinct-2" in per[p_bad]["refused"] and not per[p_bad]["gate"]["passed"]
    reg = json.loads((store / "registry.json").read_text())
    assert list(reg["adapters"]) == [p_ok] and reg["revision"] == 1 and not (store / p_bad).exists()
    man = json.loads((store / p_ok / "v1" / "manifest.json").read_text())
    assert man["run_id"] == "r1" and man["data_ids"] == ["s1"] and man["eval_metrics"]["gate"]["passed"]
    assert m["data_ids"] == ["s1"] and (tmp_path / "publish" / "manifest.json").is_file()
    reg_bytes = (store / "registry.json").read_bytes()
    again = publish_personas.run(cfg, tmp_path, base_model=base, adapters=adapters, data_ids=["s1"])
    assert again == json.loads((tmp_path / "publish" / "manifest.json").read_text())
    assert (store / "registry.json").read_bytes() == reg_bytes


def test_publish_stage_does_not_republish_after_a_crash(base, healthy, tmp_path):
    pid = _personas()[0]
    store = tmp_path / "adapters"
    _publish(store, pid, healthy[0] / "sft" / "adapter", base)  # published, then the stage "crashed"
    cfg = _cfg(publish={"gate": GATE})
    m = publish_personas.run(cfg, tmp_path, base_model=base, adapters={pid: healthy[0] / "sft" / "adapter"},
                             data_ids=[])
    got = m["metrics"]["personas"][pid]["published"]
    assert {k: got[k] for k in ("version", "name", "already")} == {"version": 1, "name": f"{pid}--v1", "already": True}
    assert json.loads((store / "registry.json").read_text())["revision"] == 1


def test_gateway_publish_without_a_token_is_a_config_error(tmp_path, monkeypatch, shared_data):
    from mascot_training.persona.config import validate

    monkeypatch.delenv("MASCOT_ADMIN_TOKEN", raising=False)
    cfg = _cfg(publish={"gateway": "127.0.0.1:50061"})
    assert any("MASCOT_ADMIN_TOKEN" in p for p in validate(cfg))
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", "t0ken")
    assert not any("MASCOT_ADMIN_TOKEN" in p for p in validate(cfg))
    # the token as a mounted file (the chart's way): it must exist
    monkeypatch.delenv("MASCOT_ADMIN_TOKEN")
    token = tmp_path / "token"
    assert any("not a readable file" in p for p in validate(_cfg(publish={"gateway": "127.0.0.1:50061",
                                                                          "token_file": str(token)})))
    token.write_text("t0ken-from-a-file\n")
    assert not any("token" in p for p in validate(_cfg(publish={"gateway": "127.0.0.1:50061",
                                                                "token_file": str(token)})))


def test_publish_never_copies_through_a_link_that_leaves_the_adapter(base, healthy, tmp_path):
    """A link at any depth to a file outside the adapter directory (``sub/passwd -> /etc/passwd``) is refused and
    nothing lands in the store; a link to a file inside it is copied as a regular file."""
    store, pid, reg, tree = _seeded_store(base, healthy, tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("not an adapter file")
    leaky = _edited_copy(healthy[0] / "sft" / "adapter", tmp_path)
    (leaky / "sub").mkdir()
    os.symlink(secret, leaky / "sub" / "passwd")
    with pytest.raises(publish.PublishError, match="sub/passwd is a link to a file outside"):
        _publish(store, pid, leaky, base)
    assert (store / "registry.json").read_bytes() == reg and _tree(store) == tree
    assert not [p for p in store.rglob("*") if p.is_file() and p.read_bytes() == secret.read_bytes()]
    os.unlink(leaky / "sub" / "passwd")
    os.symlink(tmp_path, leaky / "sub" / "up")  # a linked directory leading out
    with pytest.raises(publish.PublishError, match="linked directory sub/up"):
        _publish(store, pid, leaky, base)
    assert _tree(store) == tree
    os.unlink(leaky / "sub" / "up")
    os.symlink(leaky / "adapter_config.json", leaky / "sub" / "config_copy.json")  # stays inside: fine
    r = _publish(store, pid, leaky, base)
    copied = store / pid / f"v{r['version']}" / "sub" / "config_copy.json"
    assert not copied.is_symlink() and copied.read_bytes() == (leaky / "adapter_config.json").read_bytes()
