"""``mascot eval`` end to end."""

from __future__ import annotations

import json
import math
from collections import Counter
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.config import make_config
from tests.helpers.openai_judge import (
    AGENT_KEYS,
    COLLECTIVE_KEYS,
    ScriptedOpenAIJudge,
    key_text,
    scripted_fault,
    scripted_scores,
)
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.integration


def _sft_adapter(base_dir: Path, out: Path) -> Path:
    """A real PEFT LoRA adapter after a few SFT steps on the tiny model (stands in for a user's SFT run)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = tok(["That sounds really hard. I'm here with you."] * 2, return_tensors="pt")
    for _ in range(3):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    (out / "manifest.json").write_text(json.dumps({"data_ids": ["ed-train-0001", "ed-train-0002"]}))
    return out


@pytest.mark.slow
async def test_every_system_on_3_support_situations(engine, tiny_model_dir, shared_data, tmp_path, monkeypatch):
    from mascot.eval.runner import SYSTEMS, EvalOptions, run_eval

    monkeypatch.chdir(tmp_path)
    adapter = _sft_adapter(tiny_model_dir, tmp_path / "sft")
    # docs/data.md: the records run through the 32 emotions alphabetically; records 0, 3 and 7 (afraid, anticipating,
    # caring) are one negative, one neutral and one positive situation: every split of the report gets a dialogue.
    records = (shared_data / "empathetic_dialogues" / "test_situations.jsonl").read_text().splitlines()
    situations = tmp_path / "three.jsonl"
    situations.write_text("".join(records[i] + "\n" for i in (0, 3, 7)))
    out = tmp_path / "eval"
    every = [s for s in SYSTEMS if s != "mascot-trained"]  # that one has its own test (test_eval_trained.py)
    opts = EvalOptions(situations=situations, out_dir=out, limit=3, systems=every, agent_turns=2,
                       sft_adapter=adapter, concurrency=8)
    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)})
    phases: dict[str, int] = {}
    report = await run_eval(opts, cfg, lambda p, d, t: phases.__setitem__(p, t), engine=engine)
    assert phases["dialogues"] == 3 * 10
    saved = json.loads((out / "report.json").read_text())
    timings = report.pop("timings")
    assert timings["dialogues_generated"] == 30 and timings["total_s"] >= timings["dialogues_s"] > 0
    per = timings["per_system"]
    assert set(per) == set(every) and all(r["dialogues"] == 3 for r in per.values())
    assert all(0 <= r["first_start_s"] < r["last_end_s"] <= timings["dialogues_s"] + 0.1 and r["dialogue_s"] > 0
               for r in per.values())
    assert saved == json.loads(json.dumps(report))
    assert len(saved["situations"]) == 3 and saved["judges"] == ["local"] and saved["seed"] == 0
    assert set(saved["systems"]) == set(every)
    for system, splits in saved["systems"].items():
        assert {k: v["n"] for k, v in splits.items()} == {"positive": 1, "neutral": 1, "negative": 1, "all": 3}
        a = splits["all"]
        assert set(a["criteria"]) == set(AGENT_KEYS) and set(a["collective"]) == set(COLLECTIVE_KEYS)
        assert 0 <= a["overall"]["mean"] <= 100 and a["overall"]["std"] >= 0
        auto = a["automatic"]
        assert auto["nli"]["trained"] is False and "untrained" in auto["nli"]["model"]
        rates = [auto["nli"][k]["mean"] for k in ("entailment", "neutral", "contradiction")]
        assert sum(rates) == pytest.approx(1.0, abs=1e-5)
        assert a["safety_turns"] == 0 and a["personas"]
    assert set(saved["systems"]["multiagentesc"]["all"]["personas"]) == {"supporter"}
    lines = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
    assert len(lines) == 30
    sft_turns = [t for d in lines if d["system"] == "sft" for t in d["turns"] if t["role"] == "agent"]
    assert sft_turns and all(t["adapter_version"] == "sft" for t in sft_turns)
    nd = [t["directive"]["source"] for d in lines if d["system"] == "no-director" for t in d["turns"]
          if t["role"] == "agent"]
    assert set(nd) == {"random"}
    md = (out / "report.md").read_text()
    assert "MASCOT-C" in md and "MultiAgentESC" in md and "paper 80.0" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "radar_mascot.png" in pngs and "bar_persona_consistency.png" in pngs
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    # A second run on the same directory repeats nothing and gives the same report.
    again = await run_eval(opts, cfg, engine=engine)
    again_timings = again.pop("timings")
    assert again_timings["dialogues_generated"] == 0 and again_timings["per_system"] == {}
    assert again == report


async def test_eval_refuses_training_ids_and_bad_options(engine, tiny_model_dir, shared_data, tmp_path):
    from mascot.eval.runner import EvalOptions, run_eval

    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    first = json.loads(situations.read_text().splitlines()[1])["id"]
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"data_ids": [first, "other"]}))
    cfg = make_config(tmp_path)
    with pytest.raises(ValueError, match=f"used for training by {manifest}: {first}"):
        await run_eval(EvalOptions(situations=situations, out_dir=tmp_path / "o", limit=4, manifests=[manifest]), cfg,
                       engine=engine)
    assert not (tmp_path / "o").exists()
    (tmp_path / "afile").write_text("x")
    for kw, words in [({"systems": ["mascot", "gpt5"]}, "unknown system 'gpt5'"),
                      ({"systems": ["sft"]}, "--sft-adapter"), ({"mode": "chat"}, "--mode"),
                      ({"judges": [{"name": "a"}, {"name": "a"}]}, "judge names must be unique"),
                      ({"out_dir": tmp_path / "afile"}, "not a directory")]:
        with pytest.raises(ValueError, match=words):
            await run_eval(EvalOptions(**{"situations": situations, "out_dir": tmp_path / "o", **kw}), cfg,
                           engine=engine)


def test_resume_refuses_other_model_or_settings(tmp_path, tiny_model_dir):
    from mascot.eval.runner import EvalOptions, _check_run_file

    opts = EvalOptions(situations=tmp_path / "s.jsonl", out_dir=tmp_path)
    _check_run_file(tmp_path, opts, make_config(tmp_path))
    _check_run_file(tmp_path, opts, make_config(tmp_path))  # same settings: resumes
    with pytest.raises(ValueError, match="different model"):
        _check_run_file(tmp_path, opts, make_config(tmp_path, engine={"model": str(tiny_model_dir)}))
    with pytest.raises(ValueError, match="different speaker"):
        _check_run_file(tmp_path, opts, make_config(tmp_path, speaker={"temperature": 0.1}))


def _cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mascot.cli", "eval", *args], cwd=env["_CWD"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def check_stat(stat: dict, vals: list[float]) -> None:
    """A report statistic equals the hand computation (an empty sample is reported as None, never invented)."""
    if not vals:
        assert stat == {"mean": None, "std": None}
        return
    assert stat["mean"] == pytest.approx(statistics.fmean(vals), abs=1e-5)
    assert stat["std"] == pytest.approx(statistics.pstdev(vals), abs=1e-5)


def _expected(transcripts: list[dict]) -> dict:
    """Recompute report means/stds by hand from the transcripts and the scripted judge's rule."""
    def pct(s):
        return (s - 1) / 4 * 100

    out: dict = {}
    for d in transcripts:
        agent = [t for t in d["turns"] if t["role"] == "agent"]
        per_turn, dropped = [], 0
        for t in agent:
            if not t["text"].strip():
                continue
            if scripted_fault(t["text"]) == "garbage":
                dropped += 1
                continue
            per_turn.append(scripted_scores(t["text"], AGENT_KEYS))
        block = "\n".join(t["text"] for t in d["turns"][1:] if t["role"] == "user" or t["text"].strip())
        coll = None
        if scripted_fault(block) == "garbage":
            dropped += 1
        else:
            coll = scripted_scores(block, COLLECTIVE_KEYS)
        for split in (d["split"], "all"):
            slot = out.setdefault(d["system"], {}).setdefault(split, {"dialogues": [], "coll": [], "unparseable": 0})
            slot["unparseable"] += dropped
            if per_turn:
                crit = {k: statistics.fmean(pct(s[k]) for s in per_turn) for k in AGENT_KEYS}
                crit["overall"] = statistics.fmean(crit[k] for k in AGENT_KEYS)
                slot["dialogues"].append(crit)
            if coll:
                c = {k: pct(coll[k]) for k in COLLECTIVE_KEYS}
                c["overall"] = statistics.fmean(c[k] for k in COLLECTIVE_KEYS)
                slot["coll"].append(c)
    return out


@pytest.mark.slow
def test_scripted_judge_hand_computed_and_sigkill_resume(tiny_model_dir, shared_data, tmp_path):
    judge = ScriptedOpenAIJudge(api_key="sk-eval", faults=True).start()
    try:
        situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
        env = {**os.environ, "OPENAI_API_KEY": "sk-eval", "MASCOT_ENGINE__MODEL": str(tiny_model_dir),
               "MASCOT_ENGINE__THREADS": "1", "_CWD": str(tmp_path), "PYTHONPATH": str(ROOT)}
        args = ["--situations", str(situations), "--limit", "3", "--systems", "mascot,zero-shot,multiagentesc",
                "--agent-turns", "3", "--concurrency", "1", "--seed", "7", "--judges", f"gpt=openai:gpt-4o@{judge.url}"]
        out = tmp_path / "killed"
        # Kill once while dialogues are being written, once while judging, then finish.
        p = _cli([*args, "--out", str(out)], env)
        deadline = time.time() + 300
        while not ((out / "dialogues.jsonl").is_file() and (out / "dialogues.jsonl").read_text().count("\n") >= 2):
            assert p.poll() is None, p.stdout.read()
            assert time.time() < deadline
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        p = _cli([*args, "--out", str(out)], env)
        judge.kill_on_call(len(judge.calls) + 10, p.pid)
        p.wait(timeout=600)
        assert p.returncode == -signal.SIGKILL and judge.killed_key is not None
        calls_before = len(judge.calls)
        p = _cli([*args, "--out", str(out)], env)
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, log
        assert len(judge.calls) > calls_before
        prompts = judge.first_attempt_prompts()
        repeated = [q for q, c in Counter(prompts).items() if c > 1]
        # Only the item whose call was in flight at the kill (never answered) is asked again.
        assert len(repeated) <= 1 and all(key_text(q) == judge.killed_key for q in repeated), repeated
        resumed = json.loads((out / "report.json").read_text())
        # An uninterrupted run with the same seed gives the same report.
        p = _cli([*args, "--out", str(tmp_path / "clean")], env)
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, log
        clean = json.loads((tmp_path / "clean" / "report.json").read_text())
        assert resumed == clean
        # Means and stds equal values computed by hand from the transcripts and the scripted judge.
        transcripts = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
        expected = _expected(transcripts)
        total_dropped = 0
        for system, splits in expected.items():
            for split, e in splits.items():
                got = resumed["systems"][system][split]
                for k in (*AGENT_KEYS, "overall"):
                    vals = [d[k] for d in e["dialogues"]]
                    stat = got["overall"] if k == "overall" else got["criteria"][k]
                    check_stat(stat, vals)
                for k in (*COLLECTIVE_KEYS, "overall"):
                    vals = [c[k] for c in e["coll"]]
                    stat = got["collective_overall"] if k == "overall" else got["collective"][k]
                    check_stat(stat, vals)
                assert got["unparseable"] == e["unparseable"]
                total_dropped += e["unparseable"] if split == "all" else 0
        assert total_dropped > 0, "the planted parse failures did not occur; pick another seed"
        assert resumed["judges"] == ["gpt"]
    finally:
        judge.stop()


async def test_meeting_mode_per_domain_with_two_judges(engine, tiny_model_dir, shared_data, tmp_path, monkeypatch):
    from mascot.eval.runner import EvalOptions, run_eval

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "meeting"
    opts = EvalOptions(situations=shared_data / "qmsum" / "meeting_excerpts.jsonl", out_dir=out, mode="meeting",
                       limit=3, systems=["mascot", "zero-shot", "multiagentesc"], agent_turns=2,
                       judges=[{"name": "local"}, {"name": "second", "kind": "local"}])
    report = await run_eval(opts, make_config(tmp_path), engine=engine)
    assert report["judges"] == ["local", "second"] and set(report["by_judge"]) == {"local", "second"}
    for system, splits in report["systems"].items():
        assert {k: v["n"] for k, v in splits.items()} == {"academic": 1, "committee": 1, "product": 1, "all": 3}
        a = splits["all"]
        assert a["criteria"] == {} and a["overall"] == {"mean": None, "std": None}
        assert a["collective_overall"]["mean"] is not None
        # Identical judges: their mean equals each one.
        assert report["by_judge"]["local"][system]["all"]["collective"] == a["collective"]
    md = (out / "report.md").read_text()
    assert "Committee" in md and "Product" in md
    transcripts = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
    assert {d["split"] for d in transcripts} == {"academic", "committee", "product"}
    # Every judge figure names the model that produced it.
    from mascot.core.personas import PersonaCatalog

    assert set(report["judge_info"]) == {"local", "second"}
    assert all(j["model"] == report["models"]["backbone"] and isinstance(j["informative"], bool)
               for j in report["judge_info"].values())
    assert "## Judges" in md and f"local = {report['models']['backbone']}" in md
    assert report["measures"]["roster"] == [c.id for c in PersonaCatalog.load().in_set("meeting")]


async def test_judge_free_run_reports_measures_with_paired_statistics(engine, tiny_model_dir, shared_data, tmp_path,
                                                                      monkeypatch):
    """``--judges none``: no judge phase, no judge tables; the judge-free measures of every system, the paired
    comparisons against mascot (the ablations among them), one measure row per dialogue and a confusion matrix per
    system."""
    from mascot.eval.runner import EvalOptions, run_eval

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "free"
    systems = ["mascot", "no-persona", "zero-shot", "multiagentesc"]
    opts = EvalOptions(situations=shared_data / "empathetic_dialogues" / "test_situations.jsonl", out_dir=out,
                       limit=3, systems=systems, agent_turns=2, judges=[], concurrency=4)
    phases: dict[str, int] = {}
    report = await run_eval(opts, make_config(tmp_path), lambda p, d, t: phases.__setitem__(p, t), engine=engine)
    assert "judging" not in phases and phases["measures"] == 12
    assert not (out / "judge-results.jsonl").exists() and report["judges"] == [] and report["judge_info"] == {}
    timings = json.loads((out / "timings.json").read_text())
    assert timings["dialogues_generated"] == 12 and timings["judging_s"] < 1.0
    m = report["measures"]
    assert m["roster"] == ["empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"]
    assert m["chance"] == 0.2 and m["embedding"].endswith("all-MiniLM-L6-v2")
    assert set(m["systems"]) == set(systems) and m["paired"]["reference"] == "mascot"
    assert set(m["paired"]["systems"]) == {"no-persona", "zero-shot", "multiagentesc"}
    for s in systems:
        vals = m["systems"][s]["values"]
        assert vals["reply_words"]["n"] == 3 and vals["early_end"]["mean"] in (0.0, 1 / 3, 2 / 3, 1.0)
    # The single supporter of multiagentesc is not a roster persona: no identifiability, no pairs for it.
    assert m["systems"]["multiagentesc"]["values"]["identifiability"]["n"] == 0
    assert m["paired"]["systems"]["multiagentesc"]["identifiability"]["n"] == 0
    assert m["systems"]["mascot"]["identification"]["n"] > 0
    # Card moves: the supporter card has none, so no compliance; the roster personas' replies are assessed, and a
    # classifier needs 10 replies per persona, which 3 dialogues do not give (said, not guessed).
    assert m["systems"]["multiagentesc"]["values"]["move_compliance"]["n"] == 0
    assert m["systems"]["mascot"]["values"]["move_compliance"]["n"] >= 1
    assert set(m["systems"]["mascot"]["moves_per_persona"]) == set(m["roster"])
    dist = m["systems"]["mascot"]["distinguishability"]
    assert dist["accuracy"] is None and "needs 2+ personas with 10+ replies" in dist["reason"]
    # who speaks and in what tone: pooled figures with intervals for every system, in the JSON and the report table
    team = m["systems"]["mascot"]["team"]
    assert team["agent_turns"] == sum(s["n"] for s in team["persona_shares"].values()) > 0
    entropy = team["persona_entropy_bits"]
    assert 0.0 <= entropy["value"] <= entropy["max"] == round(math.log2(5), 6) and entropy["lo"] is not None
    assert team["directives"] > 0 and team["tone_top"]["tone"] and team["fallback_share"]["share"] is not None
    assert "supporter" in m["systems"]["multiagentesc"]["team"]["persona_shares"]  # a speaker outside the roster
    assert m["systems"]["mascot"]["values"]["moves_per_round"]["n"] == 3
    rows = [json.loads(x) for x in (out / "measures.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {r["system"] for r in rows} == set(systems)
    assert all("moves_per_round" in r and "round_redundancy" in r for r in rows)
    md = (out / "report.md").read_text()
    assert "### Who speaks and in what tone" in md and "Moves/round ↑" in md and "Round redundancy ↓" in md
    assert "## Measures without a judge" in md and "Paired differences: MASCOT minus each system" in md
    assert "MASCOT-P" in md and "Agent-specific scores" not in md and "No LLM judge ran" in md
    assert (out / "confusion_mascot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "### Persona adherence by persona" in md and "MiniLM identifiability (diagnostic)" in md
    saved = json.loads((out / "report.json").read_text())
    assert saved == json.loads(json.dumps({k: v for k, v in report.items() if k != "timings"}))


async def test_self_consistency_samples_wait_for_a_generation_slot(engine, tiny_model_dir):
    """Self-Consistency asks for five samples per step; with ``max_in_flight`` the baselines never have more
    generations on the engine than that, however many dialogues run (an unbounded flood made the simulated user's
    calls miss their deadline on 2 cores)."""
    import asyncio

    from mascot.core.dialogue import history_from_dicts
    from mascot.core.personas import PersonaCatalog
    from mascot.eval.automatic import EmbeddingRedundancy
    from mascot.eval.baselines import SC_SAMPLES, BaselineContext, _self_consistency_step

    catalog = PersonaCatalog.load()
    ctx = BaselineContext(engine=engine, speaker=None, roster=catalog.in_set("support"),
                          supporter=catalog.get("supporter"), agent_turns=2, user_speak_prob=0.0, max_tokens=8,
                          temperature=0.7, sft_adapter=None, embedder=EmbeddingRedundancy(), mode="support",
                          max_in_flight=2)
    in_flight, peak, calls = [0], [0], [0]
    generate = engine.generate

    async def counting(request, *a, **kw):
        in_flight[0] += 1
        calls[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        try:
            return await generate(request, *a, **kw)
        finally:
            in_flight[0] -= 1

    engine.generate = counting
    try:
        history = history_from_dicts([{"role": "user", "persona_id": None, "text": "I failed my exam today."}])
        await asyncio.gather(*(_self_consistency_step(ctx, history, [], seed, lines=1) for seed in range(3)))
    finally:
        engine.generate = generate
    assert calls[0] == 3 * SC_SAMPLES * 2  # a reasoning and a group-turn generation per sample
    assert peak[0] == 2
    with pytest.raises(ValueError, match="max_in_flight"):
        BaselineContext(engine=engine, speaker=None, roster=[], supporter=None, agent_turns=1, user_speak_prob=0.0,
                        max_tokens=8, temperature=0.7, sft_adapter=None, embedder=None, mode="support",
                        max_in_flight=-1)


async def test_a_baseline_whose_replies_are_all_refused_ends_early(engine, tiny_model_dir, shared_data, tmp_path,
                                                                    monkeypatch):
    """Every reply refused by the checks (settings stricter than the config allows: any word counts as a loop): the
    baseline stops after two fruitless steps and the dialogue counts as an early end, instead of generating group
    turns forever."""
    import asyncio

    from mascot.core.config import GuardConfig
    from mascot.core.guard import GuardSettings
    from mascot.eval.runner import EvalOptions, run_eval

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(GuardConfig, "settings", lambda self: GuardSettings(loop_ngram=1, loop_count=1))
    out = tmp_path / "refused"
    opts = EvalOptions(situations=shared_data / "empathetic_dialogues" / "test_situations.jsonl", out_dir=out,
                       limit=1, systems=["zero-shot"], agent_turns=2, judges=[], concurrency=1)
    report = await asyncio.wait_for(run_eval(opts, make_config(tmp_path), engine=engine), timeout=300)
    d = json.loads((out / "transcripts.jsonl").read_text().splitlines()[0])
    assert [t for t in d["turns"] if t["role"] == "agent"] == []
    values = report["measures"]["systems"]["zero-shot"]["values"]
    assert values["early_end"]["mean"] == 1.0 and values["identifiability"]["n"] == 0


async def test_a_dialogue_that_misses_its_deadline_is_started_again(engine, shared_data, tmp_path, monkeypatch):
    """An overloaded engine (here: the first director request answers after the gateway's call deadline) costs that
    dialogue one more try, not the run: every dialogue is delivered and the retry is counted in timings.json."""
    import json

    from mascot.eval.runner import EvalOptions, run_eval

    class SlowFirstDirector:
        def __init__(self, inner):
            self.inner, self.delayed = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        async def stream(self, request):
            import asyncio

            if not self.delayed and "You are the director" in request.prompt:
                self.delayed += 1
                await asyncio.sleep(4.0)
            async for item in self.inner.stream(request):
                yield item

        async def generate(self, request):
            import asyncio

            if not self.delayed and "You are the director" in request.prompt:
                self.delayed += 1
                await asyncio.sleep(4.0)
            return await self.inner.generate(request)

    monkeypatch.chdir(tmp_path)
    slow = SlowFirstDirector(engine)
    opts = EvalOptions(situations=shared_data / "empathetic_dialogues" / "test_situations.jsonl",
                       out_dir=tmp_path / "o", limit=2, systems=["mascot"], agent_turns=1, judges=[], concurrency=1)
    report = await run_eval(opts, make_config(tmp_path, server={"call_timeout_s": 2.0}), engine=slow)
    assert slow.delayed == 1
    assert report["timings"]["dialogues_retried"] == 1
    assert json.loads((tmp_path / "o" / "timings.json").read_text())["dialogues_retried"] == 1
    rows = [json.loads(line) for line in (tmp_path / "o" / "dialogues.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(any(t["role"] == "agent" for t in r["turns"]) for r in rows)
