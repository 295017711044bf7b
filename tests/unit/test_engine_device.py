"""``engine.device``: where the transformers engine runs (``auto``: a CUDA GPU when torch sees one, else the CPU);
a GPU torch does not see is refused with a message naming the setting's choices. The engine on a real GPU is
exercised by ``bench/gpu_check.py``."""
import pytest
import torch
from pydantic import ValidationError

from mascot.core.engine.transformers import TransformersEngine, resolve_device


def test_auto_is_the_cpu_without_a_gpu_and_cuda_with_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"'cuda:2': torch sees 2 CUDA GPU"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_a_gpu_torch_does_not_see_is_refused(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"torch sees 0 CUDA GPU.*use device auto or cpu"):
        resolve_device(name)


@pytest.mark.parametrize("name", ["gpu", "CUDA", "cuda:", "cuda:x", "mps"])
def test_an_unknown_device_name_is_refused(name):
    with pytest.raises(ValueError, match="is not auto, cpu, cuda or cuda:N"):
        resolve_device(name)


async def test_the_engine_refuses_an_unseen_gpu_before_loading_anything(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    eng = TransformersEngine(str(tmp_path / "no-model-here"), device="cuda")
    with pytest.raises(ValueError, match="torch sees 0 CUDA GPU"):  # not an OSError about the missing model
        await eng.start()
    assert eng.model is None


def test_the_config_passes_the_device_to_the_engine_and_checks_its_form(tmp_path):
    from mascot.core.config import EngineConfig
    from mascot.core.engine import build_engine

    assert EngineConfig().device == "auto"
    assert build_engine(EngineConfig(kind="transformers", model=str(tmp_path), device="cuda:1")).device == "cuda:1"
    for bad in ("gpu", "cuda:", "auto "):
        with pytest.raises(ValidationError):
            EngineConfig(device=bad)
