"""``mascot eval --systems ...,mascot-trained --adapters STORE``: MASCOT with an adapter store's stable versions,
compared with the untrained system over the same situations and seeds, on the tiny model."""

from __future__ import annotations

import json

import pytest

from tests.helpers.config import make_config
from tests.helpers.lora import make_lora

pytestmark = pytest.mark.integration

SUPPORT = ["empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"]


@pytest.fixture
def store_dir(tiny_model_dir, tmp_path):
    """A store holding v1 of every support persona (staged, as a training run leaves it)."""
    from mascot.core.adapters.store import open_store

    store = open_store(tmp_path / "store")
    for i, pid in enumerate(SUPPORT):
        src = make_lora(tiny_model_dir, tmp_path / "loras" / pid, seed=i, scale=0.1)
        store.publish(pid, src, base_model=str(tiny_model_dir), run_id="t", data_ids=["ed-train-0001"],
                      eval_metrics={})
    return tmp_path / "store"


def promote(store_dir, pid, n, weight=0.0):
    from mascot.core.adapters import registry as rg
    from mascot.core.adapters.store import open_store

    open_store(store_dir).update(lambda r: rg.promote(r, pid, n, weight))


def test_options_name_what_is_missing():
    from mascot.eval.runner import EvalOptions, validate

    with pytest.raises(ValueError, match=r"mascot-trained system runs only with --adapters STORE"):
        validate(EvalOptions(situations="x", out_dir="o", systems=["mascot", "mascot-trained"]))
    with pytest.raises(ValueError, match=r"add mascot-trained to --systems"):
        validate(EvalOptions(situations="x", out_dir="o", systems=["mascot"], adapters="runs/p1/adapters"))
    assert "mascot-trained" not in EvalOptions(situations="x", out_dir="o").systems  # not a default system


def test_only_stable_versions_are_served(store_dir, tmp_path, tiny_model_dir):
    from mascot.eval.runner import trained_versions

    with pytest.raises(ValueError, match=r"serves no stable version \(5 adapter\(s\) with only staged"):
        trained_versions(str(store_dir), tmp_path / "cache")
    with pytest.raises(ValueError, match="holds no adapter"):  # a mistyped path is not "promote first"
        trained_versions(str(tmp_path / "nowhere"), tmp_path / "cache")
    promote(store_dir, "anchor", 1)
    got = trained_versions(str(store_dir), tmp_path / "cache")
    assert list(got) == ["anchor"] and got["anchor"]["name"] == "anchor--v1"
    assert json.loads((store_dir / "anchor" / "v1" / "manifest.json").read_text())["digest"] == got["anchor"]["digest"]
    src = make_lora(tiny_model_dir, tmp_path / "v2", seed=9, scale=0.1)
    from mascot.core.adapters.store import open_store

    open_store(store_dir).publish("anchor", src, base_model=str(tiny_model_dir), run_id="t2", data_ids=[],
                                  eval_metrics={})
    promote(store_dir, "anchor", 2, 0.3)
    with pytest.raises(ValueError, match="anchor has a canary version open"):
        trained_versions(str(store_dir), tmp_path / "cache")
    (store_dir / "registry.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the adapter store"):
        trained_versions(str(store_dir), tmp_path / "cache")


@pytest.mark.slow
async def test_the_trained_system_joins_an_earlier_run_and_is_compared_pairwise(engine, tiny_model_dir, shared_data,
                                                                                store_dir, tmp_path, caplog):
    from mascot.core.adapters.store import open_store
    from mascot.eval.runner import EvalOptions, run_eval

    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    out = tmp_path / "eval"
    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)})
    common = dict(situations=situations, out_dir=out, limit=2, agent_turns=2, judges=[], concurrency=4)
    with pytest.raises(ValueError, match="promote the trained versions first"):
        await run_eval(EvalOptions(systems=["mascot", "mascot-trained"], adapters=str(store_dir), **common), cfg,
                       engine=engine)
    for pid in SUPPORT:
        promote(store_dir, pid, 1)
    # an earlier table without the trained system, then the trained system added to the same --out
    await run_eval(EvalOptions(systems=["mascot"], **common), cfg, engine=engine)
    assert "trained_adapters" not in json.loads((out / "run.json").read_text())
    caplog.set_level("WARNING")
    report = await run_eval(EvalOptions(systems=["mascot", "mascot-trained"], adapters=str(store_dir), **common), cfg,
                            engine=engine)
    assert report["timings"]["per_system"].keys() == {"mascot-trained"}  # the mascot dialogues were reused
    # the evaluation's stacks serve no admin plane, so no "AdapterService has no admin token" warning
    assert not [r for r in caplog.records if "admin token" in r.getMessage()]
    lines = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
    versions = {s: {t["adapter_version"] for d in lines if d["system"] == s for t in d["turns"] if t["role"] == "agent"}
                for s in ("mascot", "mascot-trained")}
    spoke = {t["persona_id"] for d in lines if d["system"] == "mascot-trained" for t in d["turns"]
             if t["role"] == "agent"}
    assert versions["mascot"] == {"base"} and spoke
    assert versions["mascot-trained"] == {f"{p}--v1" for p in spoke}  # every turn by the store's stable version
    saved = json.loads((out / "report.json").read_text())
    assert saved["models"]["trained_adapters"] == {p: f"{p}--v1" for p in SUPPORT}
    m = saved["measures"]
    assert m["paired"]["reference"] == "mascot" and set(m["paired"]["systems"]) == {"mascot-trained"}
    assert m["paired_trained"]["reference"] == "mascot-trained" and set(m["paired_trained"]["systems"]) == {"mascot"}
    assert m["paired_trained"]["systems"]["mascot"]["relevance_user"]["n"] == 2
    assert m["paired"]["systems"]["mascot-trained"]["relevance_user"]["mean_diff"] == pytest.approx(
        -m["paired_trained"]["systems"]["mascot"]["relevance_user"]["mean_diff"])
    md = (out / "report.md").read_text()
    assert "### Paired differences: MASCOT (trained) minus each system" in md and "trained_adapters" in md
    run = json.loads((out / "run.json").read_text())
    assert set(run["trained_adapters"]) == set(SUPPORT) and run["trained_adapters"]["anchor"].startswith("anchor--v1@")

    # both systems in one call, the trained one first: its stack loads the versions into the shared engine, and
    # the untrained system still speaks with the base model only
    one = tmp_path / "one-call"
    await run_eval(EvalOptions(systems=["mascot-trained", "mascot"], adapters=str(store_dir),
                               **{**common, "out_dir": one}), cfg, engine=engine)
    both = [json.loads(x) for x in (one / "transcripts.jsonl").read_text().splitlines()]
    got = {s: {t["adapter_version"] for d in both if d["system"] == s for t in d["turns"] if t["role"] == "agent"}
           for s in ("mascot", "mascot-trained")}
    assert got["mascot"] == {"base"} and got["mascot-trained"] and "base" not in got["mascot-trained"]

    # other versions in the store: the recorded dialogues no longer describe them, so the run refuses to resume
    src = make_lora(tiny_model_dir, tmp_path / "v2", seed=11, scale=0.1)
    open_store(store_dir).publish("anchor", src, base_model=str(tiny_model_dir), run_id="t2", data_ids=[],
                                  eval_metrics={})
    promote(store_dir, "anchor", 2)
    with pytest.raises(ValueError, match="holds a run with different trained_adapters"):
        await run_eval(EvalOptions(systems=["mascot", "mascot-trained"], adapters=str(store_dir), **common), cfg,
                       engine=engine)
    # a version trained on an evaluation situation is refused, naming its manifest
    first = lines[0]["situation_id"]
    src = make_lora(tiny_model_dir, tmp_path / "v3", seed=12, scale=0.1)
    open_store(store_dir).publish("beacon", src, base_model=str(tiny_model_dir), run_id="t3", data_ids=[first],
                                  eval_metrics={})
    promote(store_dir, "beacon", 2)
    with pytest.raises(ValueError, match=r"were used for training by .*beacon/v2/manifest.json"):
        await run_eval(EvalOptions(systems=["mascot", "mascot-trained"], adapters=str(store_dir),
                                   **{**common, "out_dir": tmp_path / "eval2"}), cfg, engine=engine)
