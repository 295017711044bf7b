"""``mascot eval probe``: every persona answers every situation directly, base model and an adapter store's stable
versions side by side, resumable, on the tiny model over real gRPC services."""

from __future__ import annotations

import json

import pytest

from tests.helpers.config import make_config
from tests.helpers.lora import make_lora

pytestmark = pytest.mark.integration

SUPPORT = ["empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"]


@pytest.fixture
def store_dir(tiny_model_dir, tmp_path):
    """A store where the Anchor and the Catalyst have a promoted v1 (the others none)."""
    from mascot.core.adapters import registry as rg
    from mascot.core.adapters.store import open_store

    store = open_store(tmp_path / "store")
    for i, pid in enumerate(("anchor", "catalyst")):
        src = make_lora(tiny_model_dir, tmp_path / "loras" / pid, seed=i, scale=0.1)
        store.publish(pid, src, base_model=str(tiny_model_dir), run_id="t", data_ids=["ed-train-0001"],
                      eval_metrics={})
        store.update(lambda r, pid=pid: rg.promote(r, pid, 1, 0.0))
    return tmp_path / "store"


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
async def test_probe_pairs_base_and_adapters_and_resumes(engine, tiny_model_dir, shared_data, store_dir, tmp_path):
    from mascot.eval.probe import ProbeOptions, run_probe

    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    out = tmp_path / "probe"
    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)})
    opts = ProbeOptions(situations=situations, out_dir=out, limit=2, adapters=str(store_dir), concurrency=4)
    report = await run_probe(opts, cfg, engine=engine)
    rows = _rows(out / "replies.jsonl")
    assert len(rows) == 2 * 2 * 2 * 5  # systems x conditions x situations x personas
    assert len({(r["system"], r["condition"], r["situation_id"], r["persona_id"]) for r in rows}) == len(rows)
    versions = {(r["system"], r["persona_id"]): r["adapter_version"] for r in rows}
    assert {v for (s, _), v in versions.items() if s == "base"} == {"base"}
    assert versions[("adapters", "anchor")] == "anchor--v1" and versions[("adapters", "catalyst")] == "catalyst--v1"
    assert versions[("adapters", "beacon")] == "base"  # no adapter in the store: the base model, said in the report
    # the same directive for both systems; fallback replies carry the fallback action and the card's tone
    directives = _rows(out / "directives.jsonl")
    assert len(directives) == 2 * 5
    by = {(r["system"], r["condition"], r["situation_id"], r["persona_id"]): r for r in rows}
    for d in directives:
        a, b = by[("base", "director", d["situation_id"], d["persona_id"])], \
            by[("adapters", "director", d["situation_id"], d["persona_id"])]
        assert a["directive"] == b["directive"] == {"action": d["action"], "tone": d["tone"]}
    fb = by[("base", "fallback", rows[0]["situation_id"], "anchor")]
    assert fb["directive"] == {"action": "Respond to the user's latest message in your role",
                               "tone": "Calm and empathetic"}
    assert report["trained_adapters"] == {"anchor": "anchor--v1", "catalyst": "catalyst--v1"}
    for system in ("base", "adapters"):
        for cond in ("fallback", "director"):
            res = report["results"][system][cond]
            assert res["n"] == 10 and set(res["per_persona"]) == set(SUPPORT)
            assert "distinguishability" in res and "openers" in res
    assert set(report["paired"]["director"]) == {*SUPPORT, "macro"}
    assert report["paired"]["director"]["anchor"]["compliance"]["n"] == 2
    md = (out / "probe-report.md").read_text()
    assert "## Condition: director" in md and "### adapters minus base (director)" in md
    assert "No adapter in the store for empathetic_listener, action_guide, beacon" in md
    assert report["timings"]["replies_generated"] == 40 and report["timings"]["directives_generated"] == 10
    assert (out / "probe-adherence-fallback.png").stat().st_size > 0
    assert (out / "probe-adherence-director.png").stat().st_size > 0

    # killed mid-run: the last 6 replies (and a torn line) are lost; the rerun makes only those
    kept = (out / "replies.jsonl").read_text().splitlines()[:-6]
    (out / "replies.jsonl").write_text("\n".join(kept) + "\n" + '{"system": "base", "cond')
    again = await run_probe(opts, cfg, engine=engine)
    assert again["timings"]["replies_generated"] == 6
    again_rows = _rows(out / "replies.jsonl")
    assert len(again_rows) == 40  # no duplicate, nothing lost
    assert len({(r["system"], r["condition"], r["situation_id"], r["persona_id"]) for r in again_rows}) == 40
    # other settings: refused instead of mixing runs
    with pytest.raises(ValueError, match="holds a probe with different seed"):
        await run_probe(ProbeOptions(situations=situations, out_dir=out, limit=2, adapters=str(store_dir), seed=1),
                        cfg, engine=engine)


async def test_probe_refuses_training_situations_and_bad_options(engine, tiny_model_dir, shared_data, tmp_path):
    from mascot.core.situations import load_situations
    from mascot.eval.probe import ProbeOptions, run_probe, validate

    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    first = load_situations(situations, "support", 1)[0].id
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"data_ids": [first]}))
    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)})
    with pytest.raises(ValueError, match=r"were used for training by .*manifest.json"):
        await run_probe(ProbeOptions(situations=situations, out_dir=tmp_path / "p", limit=2, manifests=[manifest]),
                        cfg, engine=engine)
    assert not (tmp_path / "p").exists()
    with pytest.raises(ValueError, match="--conditions lists each of fallback, director at most once"):
        validate(ProbeOptions(situations=situations, out_dir=tmp_path / "p", conditions=["directed"]))
    with pytest.raises(ValueError, match="promote the trained versions first|holds no adapter"):
        await run_probe(ProbeOptions(situations=situations, out_dir=tmp_path / "p", limit=1,
                                     adapters=str(tmp_path / "nowhere")), cfg, engine=engine)


async def test_fallback_only_probe_writes_no_directives(engine, tiny_model_dir, shared_data, tmp_path):
    from mascot.eval.probe import ProbeOptions, run_probe

    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)})
    report = await run_probe(ProbeOptions(situations=situations, out_dir=tmp_path / "p", limit=1,
                                          conditions=["fallback"]), cfg, engine=engine)
    assert report["conditions"] == ["fallback"] and report["systems"] == ["base"] and report["paired"] == {}
    assert not (tmp_path / "p" / "directives.jsonl").exists()
    assert len(_rows(tmp_path / "p" / "replies.jsonl")) == 5


def test_the_cli_runs_a_probe_and_says_what_is_wrong(tiny_model_dir, shared_data, tmp_path):
    """``mascot eval probe`` in a process of its own: a bad option is one line and exit 2; a run prints progress and
    the JSON summary, and a SIGKILL mid-run leaves a run that the same command finishes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.paths import ROOT

    env = {**os.environ, "MASCOT_ENGINE__MODEL": str(tiny_model_dir), "MASCOT_ENGINE__THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    cmd = [sys.executable, "-m", "mascot.cli", "eval", "probe", "--situations", str(situations)]
    bad = subprocess.run([*cmd, "--out", str(tmp_path / "x"), "--conditions", "fallback,nope"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--conditions lists each of fallback, director at most once" in bad.stderr
    out = tmp_path / "p"
    args = [*cmd, "--out", str(out), "--limit", "3", "--concurrency", "1"]
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not ((out / "replies.jsonl").is_file() and (out / "replies.jsonl").read_text().count("\n") >= 3):
        assert p.poll() is None, p.stdout.read()
        assert time.time() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout[done.stdout.index("{"):done.stdout.rindex("}") + 1])
    assert set(summary["macro"]["base"]) == {"fallback", "director"}
    assert 0 < summary["wall_seconds"]["replies_generated"] < 30  # only what the killed run had not stored
    rows = _rows(out / "replies.jsonl")
    assert len(rows) == 30 and len({(r["condition"], r["situation_id"], r["persona_id"]) for r in rows}) == 30
    assert "replies 30/30" in done.stderr or "replies 30/30" in done.stdout
