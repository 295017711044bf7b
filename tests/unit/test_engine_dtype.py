"""``engine.dtype: auto``: bfloat16 only where the machine computes it natively."""
import pytest
import torch

from mascot.core.engine import auto_dtype, native_bfloat16


@pytest.mark.parametrize("avx512_bf16,amx,expected", [(False, False, "float32"), (True, False, "bfloat16"),
                                                      (False, True, "bfloat16")])
def test_auto_dtype_follows_the_cpu(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert native_bfloat16() is (expected == "bfloat16")
    assert auto_dtype("") == expected
    assert auto_dtype("/models/qwen3-8b") == "float32"  # a named model keeps float32 unless set


def test_auto_dtype_on_a_cuda_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert auto_dtype("") == "bfloat16"


def test_build_engine_uses_auto_dtype(monkeypatch, tmp_path):
    from mascot.core.config import EngineConfig
    from mascot.core.engine import build_engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    eng = build_engine(EngineConfig(kind="transformers", model=str(tmp_path)))
    assert eng.dtype == "float32"
    assert build_engine(EngineConfig(kind="transformers", model=str(tmp_path), dtype="bfloat16")).dtype == "bfloat16"
