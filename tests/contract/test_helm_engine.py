"""The engine settings the Helm chart renders into each model service's MascotConfig: a vLLM service on GPUs shards
the model over every GPU it requests (engine.tensor_parallel_size = gpu.count, unless the config sets it), the
/dev/shm the vLLM workers need is mounted, max_model_len / max_num_seqs come from the config values, and a tensor
parallel size above the GPUs a pod gets is refused at install. Both forms: the generation service (director, speaker
and judge on one engine: generation.gpu and the merged generation.yaml) and one service per component
(generation.enabled false). Rendered offline like test_helm_chart.py, every object validated (kubernetes-validate
strict; InferenceServices against the KServe CRD)."""

from __future__ import annotations

import re

import pytest

from tests.helpers.chart import all_valid, component_config, render

ENGINE_COMPONENTS = ("director", "speaker", "judge")
#: generation.enabled false: one service per component.
PER_COMPONENT = {"generation": {"enabled": False}}


def _engine_config(r, component: str):
    """The component's rendered file read by MascotConfig itself (the pod's view)."""
    from mascot.core.config import MascotConfig

    return MascotConfig.model_validate(component_config(r, component)).engine


@pytest.mark.parametrize("service", ["speaker", "generation"])
def test_speaker_on_four_gpus_gets_tensor_parallel_size_four(crd_validators, service):
    """The service that serves the speaker (its own, or the generation service) on four GPUs."""
    form = {"generation": {"enabled": service == "generation"}}
    r = render({**form, service: {**form.get(service, {}), "gpu": {"enabled": True, "count": 4}}})
    assert r.service_of("speaker") == service
    all_valid(r, crd_validators)
    assert component_config(r, service)["engine"] == {"kind": "vllm", "dtype": "bfloat16", "model": "/mnt/models",
                                             "tensor_parallel_size": 4}
    engine = _engine_config(r, service)
    assert (engine.kind, engine.tensor_parallel_size) == ("vllm", 4)
    for comp in r.services:  # one GPU each by default
        if comp not in (service, "reward"):
            assert _engine_config(r, comp).tensor_parallel_size == 1, comp
    assert "engine" not in component_config(r, "reward")  # the reward model is no vLLM engine
    # the pod requests the four GPUs the engine shards over, with the shared memory vLLM's workers exchange through
    pod = r.one("InferenceService", f"-{service}")["spec"]["predictor"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4" == c["resources"]["requests"]["nvidia.com/gpu"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    # the same without KServe (a Deployment)
    r = render({**form, "kserve": {"enabled": False}, service: {**form.get(service, {}),
                                                               "gpu": {"enabled": True, "count": 2}}})
    assert _engine_config(r, service).tensor_parallel_size == 2
    spec = r.one("Deployment", f"-{service}")["spec"]["template"]["spec"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_a_hosted_components_gpu_count_is_unused():
    """The generation service's gpu applies to the components it hosts; their own is unused."""
    r = render({"speaker": {"gpu": {"enabled": True, "count": 4}}, "judge": {"gpu": {"enabled": False, "count": 1}}})
    assert r.hosted == ["director", "speaker", "judge"]
    assert _engine_config(r, "generation").tensor_parallel_size == 1
    (c,) = r.one("InferenceService", "-generation")["spec"]["predictor"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_an_explicit_tensor_parallel_size_wins_over_the_gpu_count():
    # the component's own config wins over the shared config, which wins over the chart's gpu.count
    r = render({**PER_COMPONENT, "config": {"engine": {"tensor_parallel_size": 2}},
                "speaker": {"gpu": {"count": 4}, "config": {"engine": {"tensor_parallel_size": 4}}},
                "director": {"gpu": {"count": 2}},
                "judge": {"gpu": {"count": 8}}})
    assert [_engine_config(r, c).tensor_parallel_size for c in ENGINE_COMPONENTS] == [2, 4, 2]
    # the generation service: shared config < a hosted component's config < generation.config, each over gpu.count
    shared = {"config": {"engine": {"tensor_parallel_size": 2}}}
    r = render({**shared, "generation": {"gpu": {"count": 4}}})
    assert _engine_config(r, "generation").tensor_parallel_size == 2
    hosted = {**shared, "speaker": {"config": {"engine": {"tensor_parallel_size": 4}}}}
    r = render({**hosted, "generation": {"gpu": {"count": 4}}})
    assert _engine_config(r, "generation").tensor_parallel_size == 4
    r = render({**hosted, "generation": {"gpu": {"count": 4}, "config": {"engine": {"tensor_parallel_size": 1}}}})
    assert _engine_config(r, "generation").tensor_parallel_size == 1


def test_services_without_gpus_or_on_the_transformers_engine_get_no_tensor_parallelism():
    r = render({**PER_COMPONENT, "speaker": {"gpu": {"enabled": False, "count": 4}},
                "director": {"gpu": {"count": 2}, "config": {"engine": {"kind": "transformers"}}}})
    assert "tensor_parallel_size" not in component_config(r, "speaker").get("engine", {})
    assert component_config(r, "director")["engine"]["kind"] == "transformers"
    assert "tensor_parallel_size" not in component_config(r, "director")["engine"]
    for comp in ("speaker", "director"):
        assert _engine_config(r, comp).tensor_parallel_size == 1  # valid: the transformers engine refuses > 1
    # the generation service: without GPUs, or on the transformers engine a hosted component's config names
    r = render({"generation": {"gpu": {"enabled": False, "count": 4}}})
    assert "tensor_parallel_size" not in component_config(r, "generation").get("engine", {})
    r = render({"generation": {"gpu": {"count": 2}}, "director": {"config": {"engine": {"kind": "transformers"}}}})
    assert component_config(r, "generation")["engine"]["kind"] == "transformers"
    assert "tensor_parallel_size" not in component_config(r, "generation")["engine"]
    assert _engine_config(r, "generation").tensor_parallel_size == 1


def test_max_model_len_and_max_num_seqs_values_land_in_the_engine_config():
    shared = {"config": {"engine": {"max_model_len": 8192, "max_num_seqs": 128}}}
    r = render({**PER_COMPONENT, **shared,
                "speaker": {"gpu": {"count": 2}, "config": {"engine": {"max_num_seqs": 256}}}})
    for comp in ENGINE_COMPONENTS:
        engine = _engine_config(r, comp)
        want = 256 if comp == "speaker" else 128
        assert engine.max_model_len == 8192, comp
        # max_num_seqs is vLLM's name for max_batch_size: the one limit the engine gets
        assert (engine.max_num_seqs, engine.max_batch_size) == (want, want), comp
    assert _engine_config(r, "speaker").tensor_parallel_size == 2
    # the generation service's one engine: the shared values, a hosted component's over them
    r = render({**shared, "generation": {"gpu": {"count": 2}}})
    engine = _engine_config(r, "generation")
    assert (engine.max_model_len, engine.max_num_seqs, engine.max_batch_size, engine.tensor_parallel_size) == (
        8192, 128, 128, 2)
    r = render({**shared, "speaker": {"config": {"engine": {"max_num_seqs": 256}}}})
    assert _engine_config(r, "generation").max_num_seqs == 256


@pytest.mark.parametrize("values,message", [
    ({**PER_COMPONENT, "speaker": {"config": {"engine": {"tensor_parallel_size": 2}}}},
     "speaker: engine.tensor_parallel_size (2) exceeds speaker.gpu.count (1): vLLM could not start on the GPUs the "
     "pod gets; raise speaker.gpu.count or lower it"),
    ({**PER_COMPONENT, "config": {"engine": {"tensor_parallel_size": 8}}, "judge": {"gpu": {"count": 4}}},
     "judge: engine.tensor_parallel_size (8) exceeds judge.gpu.count (4)"),
    ({"generation": {"config": {"engine": {"tensor_parallel_size": 2}}}},
     "generation: engine.tensor_parallel_size (2) exceeds generation.gpu.count (1): vLLM could not start on the GPUs "
     "the pod gets; raise generation.gpu.count or lower it"),
    # a hosted component's config reaches the generation service's engine, and is checked against its GPUs
    ({"speaker": {"gpu": {"count": 4}, "config": {"engine": {"tensor_parallel_size": 4}}}},
     "generation: engine.tensor_parallel_size (4) exceeds generation.gpu.count (1)"),
    ({"config": {"engine": {"tensor_parallel_size": 8}}, "generation": {"gpu": {"count": 4}}},
     "generation: engine.tensor_parallel_size (8) exceeds generation.gpu.count (4)"),
    # a service without GPUs runs the transformers engine, which cannot shard: refused at install, not at pod start
    ({"config": {"engine": {"tensor_parallel_size": 2}}, "generation": {"gpu": {"enabled": False, "count": 1}}},
     "generation: engine.tensor_parallel_size (2) needs the vllm engine, and this service runs transformers"),
], ids=["component", "shared-config", "generation", "hosted-component-config", "generation-shared-config",
        "cpu-service"])
def test_a_tensor_parallel_size_above_the_gpu_count_is_refused_at_install(values, message):
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


def test_out_of_range_engine_values_are_refused_by_the_schema():
    import helm_python as helm

    for values, pointer in [({"config": {"engine": {"tensor_parallel_size": 0}}},
                             "/config/engine/tensor_parallel_size"),
                            ({"speaker": {"config": {"engine": {"max_num_seqs": 0}}}},
                             "/speaker/config/engine/max_num_seqs"),
                            ({"generation": {"config": {"engine": {"max_num_seqs": 0}}}},
                             "/generation/config/engine/max_num_seqs"),
                            ({"config": {"engine": {"log_stats": "yes"}}}, "/config/engine/log_stats")]:
        with pytest.raises(helm.HelmValuesError) as e:
            render(values)
        assert pointer in str(e.value), str(e.value)
