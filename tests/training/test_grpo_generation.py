"""The GRPO generation backend of both phases (``persona_grpo.generation``, ``director_grpo.generation``): the
settings map onto exactly the TRL 1.16 ``GRPOConfig`` fields they name (real ``GRPOConfig`` objects), ``transformers``
stays the default, and ``vllm`` is refused on a machine without CUDA at config load and again before training."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from mascot_training.common.config import ConfigError, GenerationConfig, LoraConfig, generation_problems
from mascot_training.persona.config import GrpoConfig

torch = pytest.importorskip("torch")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _trl_config(tmp_path, **fields):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields)


def _changed(tmp_path, mapping: dict) -> dict:
    """The GRPOConfig fields whose value differs from TRL's defaults once ``mapping`` is applied."""
    base, mapped = _trl_config(tmp_path), _trl_config(tmp_path, **mapping)
    return {f.name: getattr(mapped, f.name) for f in dataclasses.fields(mapped)
            if getattr(mapped, f.name) != getattr(base, f.name)}


def test_transformers_is_the_default_and_maps_to_no_vllm(tmp_path):
    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.collaborative.director_grpo import grpo_args as director_args
    from mascot_training.common.grpo import trl_generation_args
    from mascot_training.persona.persona_grpo import grpo_args

    assert GrpoConfig().generation == GenerationConfig() and GenerationConfig().backend == "transformers"
    assert CollaborativeConfig().director_grpo.generation.backend == "transformers"
    assert trl_generation_args(GenerationConfig(), 2048) == {"use_vllm": False}
    assert grpo_args(GrpoConfig(), tmp_path).use_vllm is False
    assert director_args(CollaborativeConfig(), tmp_path).use_vllm is False


def test_gradient_checkpointing_maps_to_trl_and_is_off_by_default(tmp_path):
    """``gradient_checkpointing`` of both GRPO stages reaches TRL's ``GRPOConfig`` as set (off unless asked)."""
    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.collaborative.director_grpo import grpo_args as director_args
    from mascot_training.persona.persona_grpo import grpo_args

    assert grpo_args(GrpoConfig(), tmp_path).gradient_checkpointing is False
    assert grpo_args(GrpoConfig(gradient_checkpointing=True), tmp_path).gradient_checkpointing is True
    assert director_args(CollaborativeConfig(), tmp_path).gradient_checkpointing is False
    on = CollaborativeConfig(director_grpo={"gradient_checkpointing": True})
    assert director_args(on, tmp_path).gradient_checkpointing is True


@pytest.mark.parametrize("gen,max_len,sampling,expected", [
    ({"backend": "vllm", "vllm_gpu_memory_utilization": 0.45, "vllm_tensor_parallel_size": 2}, 4096, True,
     {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.45,
      "vllm_tensor_parallel_size": 2, "vllm_max_model_length": 4096}),
    ({"backend": "vllm", "vllm_mode": "server", "vllm_server_host": "vllm-0.trainers", "vllm_server_port": 8011,
      "vllm_server_timeout_s": 600}, 4096, True,
     {"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "vllm-0.trainers", "vllm_server_port": 8011,
      "vllm_server_timeout": 600.0}),
    ({"backend": "vllm", "vllm_mode": "server", "vllm_server_base_url": "http://vllm.trainers:9000",
      "vllm_server_port": 8011}, None, True,
     {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://vllm.trainers:9000",
      "vllm_server_timeout": 240.0}),
    ({"backend": "vllm"}, 2048, False,  # the director: its rollouts return no sampling log-probabilities
     {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3, "vllm_tensor_parallel_size": 1,
      "vllm_max_model_length": 2048, "vllm_importance_sampling_correction": False}),
])
def test_vllm_settings_map_onto_exactly_those_grpo_config_fields(tmp_path, gen, max_len, sampling, expected):
    from trl import GRPOConfig

    from mascot_training.common.grpo import trl_generation_args

    mapping = trl_generation_args(GenerationConfig(**gen), max_len, importance_sampling=sampling)
    assert mapping == expected
    assert set(mapping) <= {f.name for f in dataclasses.fields(GRPOConfig)}  # real field names of this TRL
    built = _trl_config(tmp_path, **mapping)
    assert {k: getattr(built, k) for k in mapping} == expected
    # nothing else moves: every field that differs from TRL's defaults is one the mapping names
    assert set(_changed(tmp_path, mapping)) <= set(mapping)


def test_generation_settings_are_checked_as_values(tmp_path):
    from pydantic import ValidationError

    for bad in ({"backend": "sglang"}, {"vllm_mode": "remote"}, {"vllm_server_port": 0},
                {"vllm_gpu_memory_utilization": 1.5}, {"vllm_tensor_parallel_size": 0},
                {"vllm_server_base_url": "vllm:8000"}, {"vllm_gpu_memory": 0.5}):
        with pytest.raises(ValidationError):
            GenerationConfig(**bad)


def test_vllm_on_a_cuda_machine_has_no_problem():
    gen = GenerationConfig(backend="vllm")
    assert generation_problems("persona_grpo", gen, cuda_available=True) == []
    assert generation_problems("persona_grpo", GenerationConfig(), cuda_available=False) == []
    (msg,) = generation_problems("director_grpo", gen, cuda_available=False)
    assert msg.startswith("director_grpo.generation.backend is vllm but this machine has no CUDA GPU")


def _phase1(tmp_path, shared_data, **grpo):
    p = tmp_path / "p1.yaml"
    p.write_text(yaml.safe_dump({"model": "tiny", "personas": ["anchor"],
                                 "data": {"situations": str(shared_data / "empathetic_dialogues" /
                                                            "test_situations.jsonl")},
                                 "persona_grpo": {"num_generations": 4, "batch_size": 8, **grpo}}))
    return p


def _phase2(tmp_path, shared_data, **grpo):
    p = tmp_path / "p2.yaml"
    p.write_text(yaml.safe_dump({"model": "tiny", "personas": ["anchor", "catalyst"],
                                 "data": {"situations": str(shared_data / "empathetic_dialogues" /
                                                            "test_situations.jsonl")},
                                 "phase2": {"num_generations": 4}, "director_grpo": {"batch_size": 4, **grpo}}))
    return p


@NO_CUDA
def test_vllm_without_cuda_is_refused_at_config_load_naming_the_setting(tmp_path, shared_data):
    from mascot_training.collaborative import config as collab_config
    from mascot_training.persona import config

    assert config.load(_phase1(tmp_path, shared_data)).persona_grpo.generation.backend == "transformers"
    with pytest.raises(ConfigError) as e:
        config.load(_phase1(tmp_path, shared_data, generation={"backend": "vllm"}))
    msg = str(e.value)
    assert "persona_grpo.generation.backend is vllm but this machine has no CUDA GPU" in msg
    assert "copies the trained weights into vLLM after every step" in msg
    assert "use persona_grpo.generation.backend: transformers" in msg

    assert collab_config.load(_phase2(tmp_path, shared_data)).director_grpo.generation.backend == "transformers"
    with pytest.raises(ConfigError) as e:
        collab_config.load(_phase2(tmp_path, shared_data, generation={"backend": "vllm", "vllm_mode": "server"}))
    msg = str(e.value)
    assert "director_grpo.generation.backend is vllm but this machine has no CUDA GPU" in msg
    # the director's rollouts cannot use a server shared by every process: said in the same message
    assert "support vllm only with vllm_mode colocate and vllm_tensor_parallel_size 1" in msg


@NO_CUDA
def test_vllm_without_cuda_is_refused_before_training_starts(tmp_path):
    """A config built in code (not loaded) is refused when the trainer's arguments are made, before any model."""
    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.collaborative.director_grpo import grpo_args as director_args
    from mascot_training.persona.persona_grpo import grpo_args, train_persona

    with pytest.raises(ConfigError, match="persona_grpo.generation.backend is vllm"):
        grpo_args(GrpoConfig(generation={"backend": "vllm"}), tmp_path)
    with pytest.raises(ConfigError, match="persona_grpo.generation.backend is vllm"):  # no model is read
        train_persona(str(tmp_path / "no-such-model"), [], lambda **_: [], GrpoConfig(generation={"backend": "vllm"}),
                      LoraConfig(), tmp_path)
    with pytest.raises(ConfigError, match="director_grpo.generation.backend is vllm"):
        director_args(CollaborativeConfig(director_grpo={"generation": {"backend": "vllm"}}), tmp_path)
