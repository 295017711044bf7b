"""The generation service of the Helm chart (values ``generation``): director, speaker and judge are one base model
with different adapters, so by default one model service ``generation`` runs ``mascot serve-model
director,speaker,judge`` on one engine, beside the reward service. Rendered offline like test_helm_chart.py, every
object validated strictly (kubernetes-validate 1.33; InferenceServices against the KServe CRD): the default, its
config merge order, a component left out of it (disabled, or not listed), one service per component
(generation.enabled false or an empty list), the storageUri and schema refusals, and a hosted component's deployment
keys being unused."""

from __future__ import annotations

import pytest

from tests.helpers.chart import (
    MODEL_COMPONENTS, NAMESPACE, RELEASE, all_valid, cli_accepts, component_config, rejected, render,
)

FULLNAME = f"{RELEASE}-mascot"
PORTS = {"generation": 50060, "director": 50061, "speaker": 50062, "judge": 50063, "reward": 50064}


def _headless_target(service: str) -> str:
    """The gRPC target of a model service: its headless Service."""
    return f"dns:///{FULLNAME}-{service}-headless.{NAMESPACE}.svc.cluster.local:{PORTS[service]}"


def _containers(r) -> dict[str, dict]:
    """model service -> the one container of its InferenceService predictor (or Deployment without KServe)."""
    out = {}
    for kind in ("InferenceService", "Deployment"):
        for obj in r.of_kind(kind):
            name = obj["metadata"]["name"].removeprefix(f"{FULLNAME}-")
            if name == "gateway":
                continue
            spec = obj["spec"]["predictor"] if kind == "InferenceService" else obj["spec"]["template"]["spec"]
            (out[name],) = spec["containers"]
    return out


def _gateway(r) -> dict:
    return component_config(r, "gateway")["server"]


def _valid_config(r, service: str) -> dict:
    """The rendered file of a model service, checked by MascotConfig itself (the pod's view)."""
    from mascot.core.config import MascotConfig

    raw = component_config(r, service)
    MascotConfig.model_validate(raw)
    return raw


# ----------------------------------------------------------------------------------------------- (a) the default
def test_by_default_one_generation_service_serves_director_speaker_and_judge(crd_validators):
    r = render({})
    all_valid(r, crd_validators)
    assert r.hosted == ["director", "speaker", "judge"] and r.services == ["generation", "reward"]
    isvcs = sorted(o["metadata"]["name"] for o in r.of_kind("InferenceService"))
    assert isvcs == [f"{FULLNAME}-generation", f"{FULLNAME}-reward"]  # no director, speaker or judge service
    containers = _containers(r)
    c = containers["generation"]
    assert c["command"] == ["mascot", "serve-model"]
    assert c["args"] == ["director,speaker,judge", "--port", "50060", "--rest-port", "8080", "--host", "0.0.0.0"]
    cli_accepts(c["command"][1:] + c["args"])
    assert ("grpc", 50060) in [(p["name"], p["containerPort"]) for p in c["ports"]]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MASCOT_CONFIG"] == "/etc/mascot/config/generation.yaml"
    assert env["STORAGE_URI"] == "pvc://mascot-models/Qwen3-8B"  # the base model (model.storageUri)
    assert containers["reward"]["args"][0] == "reward"
    isvc = r.one("InferenceService", "-generation")
    assert isvc["metadata"]["labels"]["app.kubernetes.io/component"] == "generation"
    assert isvc["spec"]["predictor"]["labels"]["app.kubernetes.io/component"] == "generation"
    # no object of the hosted components: their section's deployment keys are unused
    for _, obj in r.objects:
        name = obj["metadata"]["name"]
        assert not any(name.startswith(f"{FULLNAME}-{comp}") for comp in ("director", "speaker", "judge")), name
    # the gateway dials the generation service's headless Service for both the director and the speaker
    server = _gateway(r)
    assert server["director_target"] == server["speaker_target"] == _headless_target("generation")
    headless = r.one("Service", "-generation-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"]["app.kubernetes.io/component"] == "generation"
    assert [(p["name"], p["port"]) for p in headless["spec"]["ports"]] == [("grpc", 50060)]
    assert headless["spec"]["selector"].items() <= isvc["spec"]["predictor"]["labels"].items()
    # one config file per service; the engine shards over generation.gpu.count GPUs (1 by default)
    assert sorted(r.one("ConfigMap", "-config")["data"]) == ["gateway.yaml", "generation.yaml", "reward.yaml"]
    engine = _valid_config(r, "generation")["engine"]
    assert engine["kind"] == "vllm" and engine["tensor_parallel_size"] == 1 == r.effective["generation"]["gpu"]["count"]
    # `helm test` checks the gateway and each model service once
    (t,) = r.one("Pod", "-test-health")["spec"]["containers"]
    assert t["args"][3::2] == [f"{FULLNAME}-gateway:50051", _headless_target("generation"), _headless_target("reward")]
    assert f"generation (director,speaker,judge on one engine): {_headless_target('generation')}" in r.notes


def test_the_generation_engine_is_sharded_over_generation_gpu_count(crd_validators):
    r = render({"generation": {"gpu": {"enabled": True, "count": 2}}})
    all_valid(r, crd_validators)
    engine = _valid_config(r, "generation")["engine"]
    assert (engine["kind"], engine["tensor_parallel_size"]) == ("vllm", 2)
    c = _containers(r)["generation"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2" == c["resources"]["requests"]["nvidia.com/gpu"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert _containers(r)["reward"]["resources"]["limits"]["nvidia.com/gpu"] == "1"


# ----------------------------------------------------------------------------------------------- (b) merge order
MERGE_VALUES = {
    "config": {"speaker": {"max_tokens": 5, "temperature": 0.1}, "engine": {"max_num_seqs": 32}},  # shared: lowest
    "director": {"config": {"director": {"max_tokens": 11}, "engine": {"max_num_seqs": 64}}},
    "speaker": {"config": {"speaker": {"max_tokens": 22, "temperature": 0.5}, "engine": {"max_num_seqs": 96}}},
    "generation": {"config": {"speaker": {"temperature": 0.9}}},
}


def test_generation_config_merges_shared_then_each_hosted_component_then_its_own(crd_validators):
    """config < director.config < speaker.config (generation.components order) < generation.config."""
    r = render(MERGE_VALUES)
    all_valid(r, crd_validators)
    cfg = _valid_config(r, "generation")
    assert cfg["director"]["max_tokens"] == 11
    assert cfg["speaker"]["max_tokens"] == 22  # the speaker's over the shared 5
    assert cfg["speaker"]["temperature"] == 0.9  # generation.config over the speaker's 0.5 and the shared 0.1
    assert cfg["engine"]["max_num_seqs"] == 96  # the speaker comes after the director in generation.components
    # the other files get the shared config only
    for service in ("gateway", "reward"):
        other = _valid_config(r, service)
        assert other["speaker"] == {"max_tokens": 5, "temperature": 0.1} and "director" not in other, service
    # the list's order decides between two hosted components (and orders the served components)
    swapped = render({**MERGE_VALUES, "generation": {**MERGE_VALUES["generation"],
                                                     "components": ["speaker", "director", "judge"]}})
    all_valid(swapped, crd_validators)
    assert _valid_config(swapped, "generation")["engine"]["max_num_seqs"] == 64
    assert _containers(swapped)["generation"]["args"][0] == "speaker,director,judge"
    # one service per component: each file merges its own component's config only
    per = render({**MERGE_VALUES, "generation": {**MERGE_VALUES["generation"], "enabled": False}})
    all_valid(per, crd_validators)
    director, speaker = _valid_config(per, "director"), _valid_config(per, "speaker")
    assert director["director"] == {"max_tokens": 11} and director["engine"]["max_num_seqs"] == 64
    assert director["speaker"] == {"max_tokens": 5, "temperature": 0.1}
    assert speaker["speaker"] == {"max_tokens": 22, "temperature": 0.5} and "director" not in speaker
    assert "generation.yaml" not in per.one("ConfigMap", "-config")["data"]


# ----------------------------------------------------------------------------------------------- (c), (d) who joins
def test_a_disabled_component_does_not_join_the_generation_service(crd_validators):
    r = render({"judge": {"enabled": False}})
    all_valid(r, crd_validators)
    assert r.hosted == ["director", "speaker"] and r.services == ["generation", "reward"]
    assert _containers(r)["generation"]["args"][0] == "director,speaker"
    assert sorted(o["metadata"]["name"] for o in r.of_kind("InferenceService")) == [
        f"{FULLNAME}-generation", f"{FULLNAME}-reward"]
    assert "generation (director,speaker on one engine)" in r.notes


def test_a_component_left_out_of_generation_components_gets_its_own_service(crd_validators):
    r = render({"generation": {"components": ["speaker"]}})
    all_valid(r, crd_validators)
    assert r.hosted == ["speaker"] and r.services == ["generation", "director", "judge", "reward"]
    containers = _containers(r)
    assert sorted(containers) == ["director", "generation", "judge", "reward"]
    assert containers["generation"]["args"][:3] == ["speaker", "--port", "50060"]
    assert containers["director"]["args"][:3] == ["director", "--port", "50061"]
    assert containers["judge"]["args"][:3] == ["judge", "--port", "50063"]
    server = _gateway(r)
    assert server["director_target"] == _headless_target("director")
    assert server["speaker_target"] == _headless_target("generation")
    for service in ("generation", "director"):
        assert r.one("Service", f"-{service}-headless")["spec"]["ports"][0]["port"] == PORTS[service]
    assert sorted(r.one("ConfigMap", "-config")["data"]) == sorted(
        f"{s}.yaml" for s in ("gateway", "generation", "director", "judge", "reward"))
    assert _valid_config(r, "director")["engine"]["tensor_parallel_size"] == 1


# ----------------------------------------------------------------------------------------------- (e) per component
@pytest.mark.parametrize("values", [{"generation": {"enabled": False}}, {"generation": {"components": []}}],
                         ids=["disabled", "empty-list"])
def test_without_the_generation_service_each_component_has_its_own(crd_validators, values):
    r = render(values)
    all_valid(r, crd_validators)
    assert r.hosted == [] and r.services == list(MODEL_COMPONENTS)
    containers = _containers(r)
    assert sorted(containers) == sorted(MODEL_COMPONENTS)
    for comp in MODEL_COMPONENTS:
        assert containers[comp]["args"][:3] == [comp, "--port", str(PORTS[comp])], comp
        assert r.one("Service", f"-{comp}-headless")["spec"]["ports"][0]["port"] == PORTS[comp]
    server = _gateway(r)
    assert (server["director_target"], server["speaker_target"]) == (
        _headless_target("director"), _headless_target("speaker"))
    assert not [o for _, o in r.objects if "-generation" in o["metadata"]["name"]]
    assert sorted(r.one("ConfigMap", "-config")["data"]) == sorted(f"{s}.yaml" for s in ("gateway", *MODEL_COMPONENTS))


# ----------------------------------------------------------------------------------------------- (f), (g) refusals
def test_a_hosted_component_with_a_model_of_its_own_is_refused():
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError) as e:
        render({"judge": {"storageUri": "pvc://mascot-models/judge-13b"}})
    message = str(e.value)
    assert "invalid values" in message and "templates/validate.yaml" in message
    assert "judge.storageUri (pvc://mascot-models/judge-13b)" in message and "generation.components" in message
    assert "director.storageUri" not in message and "speaker.storageUri" not in message
    # the base model the generation service serves (model.storageUri, or generation.storageUri) is no other model
    render({"judge": {"storageUri": "pvc://mascot-models/Qwen3-8B"}})
    r = render({"generation": {"storageUri": "s3://models/qwen3-8b"}, "judge": {"storageUri": "s3://models/qwen3-8b"}})
    assert {e["name"]: e.get("value") for e in _containers(r)["generation"]["env"]}["STORAGE_URI"] == \
        "s3://models/qwen3-8b"
    with pytest.raises(helm.HelmRenderError, match=r"speaker\.storageUri \(pvc://mascot-models/Qwen3-8B\)"):
        render({"generation": {"storageUri": "s3://models/qwen3-8b"},
                "speaker": {"storageUri": "pvc://mascot-models/Qwen3-8B"}})
    # served on its own (left out of the list, or no generation service), it may have its own model
    for values in ({"generation": {"components": ["director", "speaker"]}}, {"generation": {"enabled": False}}):
        r = render({**values, "judge": {"storageUri": "pvc://mascot-models/judge-13b"}})
        env = {e["name"]: e.get("value") for e in _containers(r)["judge"]["env"]}
        assert env["STORAGE_URI"] == "pvc://mascot-models/judge-13b"


def test_the_schema_refuses_what_cannot_join_the_generation_service():
    # the reward model is another model: it cannot share the base model's engine
    rejected({"generation": {"components": ["reward"]}}, "/generation/components/0",
             "must be one of 'director', 'speaker', 'judge'")
    rejected({"generation": {"components": ["director", "director"]}}, "/generation/components", "are equal")
    rejected({"generation": {"replicas": 2}}, "/generation", "replicas")
    rejected({"generation": {"grpcPort": 70000}}, "/generation/grpcPort", "65,535")


# ----------------------------------------------------------------------------------------------- unused keys
def test_a_hosted_components_deployment_keys_change_nothing(crd_validators):
    """While the generation service hosts it, a component's grpcPort, gpu, replicas, resources, scheduling, extension
    points and pdb are unused: the release renders exactly as without them."""
    keys = {"grpcPort": 50070, "gpu": {"enabled": False, "count": 4}, "minReplicas": 2, "maxReplicas": 3,
            "scaleTarget": 50, "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
            "nodeSelector": {"pool": "cpu"}, "priorityClassName": "mascot-low", "podLabels": {"team": "x"},
            "extraEnv": [{"name": "EXTRA", "value": "1"}], "pdb": {"enabled": True}}
    base = render({})
    changed = render({comp: keys for comp in ("director", "speaker", "judge")})
    all_valid(changed, crd_validators)
    assert changed.objects == base.objects
    # and not once generation.enabled is false: then they are the components' own
    per = render({"generation": {"enabled": False}, "director": keys})
    all_valid(per, crd_validators)
    assert _containers(per)["director"]["args"][:3] == ["director", "--port", "50070"]
    assert per.one("PodDisruptionBudget", "-director")
