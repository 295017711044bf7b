"""TLS, mutual TLS and caller tokens in the Helm chart (docs/deployment.md, docs/security.md), for every
helm/mascot/ci/*.yaml and a few values of their own: each component's rendered config carries server.tls naming the
files of the mounted TLS Secret and loads in MascotConfig; the gRPC probes are kubelet `grpc` probes in plaintext and
`mascot health` exec probes under TLS; the rendered probe and `helm test` commands pass against real TLS and
mutual-TLS servers (a throwaway CA, the rendered config with the Secret's files laid out as the pod sees them); the
caller-token Secret is mounted in the gateway only and named by security.caller_tokens_file; values.schema.json
rejects the combinations that cannot work."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import pytest
import yaml

from tests.helpers.chart import (
    CI_IDS, MODEL_COMPONENTS, RELEASE, cli_accepts, component_config, load_ci, pod_specs, rejected, render,
)
from tests.helpers.paths import ROOT

DEFAULT_MOUNT = "/etc/mascot/tls"
TLS_ON = {ci: bool((load_ci(ci).get("tls") or {}).get("existingSecret")) for ci in CI_IDS}


def tls_values(r) -> dict:
    """The ci file's `tls` values with the chart's defaults."""
    return {"existingSecret": "", "mountPath": DEFAULT_MOUNT, "hasCA": True, "mutual": False, "serverName": "",
            **(r.values.get("tls") or {})}


def workloads(r) -> dict[str, tuple[dict, dict]]:
    """component -> (pod spec, its container) of the gateway, the control plane (when it renders) and every enabled
    model service (the generation service or a component's own; InferenceService predictor or Deployment), plus
    "test" for the `helm test` Pod."""
    out = {}
    for _, obj in r.objects:
        if obj["kind"] not in ("Deployment", "InferenceService", "Pod"):
            continue
        comp = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        if comp in ("gateway", "control", "test", "generation", *MODEL_COMPONENTS):
            ((_, spec),) = pod_specs(obj)
            out[comp] = (spec, spec["containers"][0])
    return out


def config_of(r, container: dict) -> tuple[str, dict]:
    """(the ConfigMap key a container reads through MASCOT_CONFIG, its parsed YAML)."""
    env = {e["name"]: e.get("value") for e in container["env"]}
    key = env["MASCOT_CONFIG"].removeprefix("/etc/mascot/config/")
    return key, yaml.safe_load(r.one("ConfigMap", "-config")["data"][key]) or {}


def grpc_port(container: dict) -> int:
    """The container's gRPC port: "grpc", or the control plane's "control"."""
    (port,) = [p["containerPort"] for p in container.get("ports", []) if p["name"] in ("grpc", "control")]
    return port


def _control(r) -> set[str]:
    return {"control"} if [d for d in r.of_kind("Deployment") if d["metadata"]["name"].endswith("-control")] else set()


# ----------------------------------------------------------------------------------------------- server.tls
@pytest.mark.parametrize("ci", CI_IDS)
def test_every_component_config_names_the_files_of_the_mounted_tls_secret(rendered, ci):
    from mascot.core.config import MascotConfig
    from mascot.core.server import ClientTLS

    r, t = rendered[ci], tls_values(rendered[ci])
    pods = workloads(r)
    assert set(pods) == {"gateway", "test", *_control(r), *r.services}
    assert len(pods) == 2 + len(_control(r)) + len(r.services)
    for comp, (spec, c) in pods.items():
        key, raw = config_of(r, c)
        assert key == ("gateway.yaml" if comp == "test" else f"{comp}.yaml")
        cfg = MascotConfig.model_validate(raw)  # the real model: TLSConfig's own checks (pairs, client_auth + CA)
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        if not TLS_ON[ci]:
            assert "tls" not in raw.get("server", {}) and not cfg.server.tls.enabled, comp
            assert "tls" not in volumes and "tls" not in mounts, comp
            continue
        tls = cfg.server.tls
        assert tls.enabled, comp
        secret, mount = volumes["tls"]["secret"], mounts["tls"]
        assert secret["secretName"] == t["existingSecret"] and mount["readOnly"] is True
        assert mount["mountPath"] == t["mountPath"]
        # every file server.tls names is an item of the Secret volume, at the path the container mounts it
        files = {f"{mount['mountPath'].rstrip('/')}/{item['path']}": item["key"] for item in secret["items"]}
        want = {tls.cert_file: "tls.crt", tls.key_file: "tls.key"}
        if t["hasCA"]:
            want[tls.ca_file] = "ca.crt"
        else:
            assert tls.ca_file == ""
        assert files == want, comp
        assert tls.client_auth is bool(t["mutual"]) and tls.server_name == t["serverName"], comp
        assert not tls.client_cert_file and not tls.client_key_file
        # the gateway's (and the test Pod's) outbound channels: the CA, and under mutual TLS tls.crt as client cert
        client = ClientTLS.from_config(tls)
        assert client.enabled and client.ca_file == tls.ca_file and client.server_name == t["serverName"]
        assert (client.cert_file, client.key_file) == ((tls.cert_file, tls.key_file) if t["mutual"] else ("", ""))


def test_full_ci_file_renders_mutual_tls_and_caller_auth():
    """ci/full.yaml is the file that renders TLS + mutual TLS + caller tokens in CI (a change to it must keep that)."""
    values = load_ci("full.yaml")
    assert values["tls"]["existingSecret"] and values["tls"]["mutual"] is True and values["tls"]["serverName"]
    assert values["security"]["callerAuth"]["enabled"] is True and values["security"]["callerAuth"]["existingSecret"]
    assert not TLS_ON["minimal.yaml"] and not TLS_ON["external-postgresql.yaml"]  # plaintext stays covered


def test_user_config_keys_still_win_over_the_chart_tls_settings():
    from mascot.core.config import MascotConfig

    for generation in (True, False):  # the generation service's file merges the director's config; or its own file
        form = {"generation": {"enabled": generation}}
        r = render({**form, "tls": {"existingSecret": "s", "mountPath": "/tls/"},
                    "config": {"server": {"tls": {"server_name": "shared.internal"}}},
                    "gateway": {"config": {"server": {"tls": {"client_cert_file": "/etc/client/tls.crt",
                                                              "client_key_file": "/etc/client/tls.key"}}}}})
        gw = MascotConfig.model_validate(component_config(r, "gateway")).server.tls
        assert (gw.cert_file, gw.key_file, gw.ca_file) == ("/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt")
        assert gw.server_name == "shared.internal" and gw.client_cert_file == "/etc/client/tls.crt"
        speaker = MascotConfig.model_validate(component_config(r, r.service_of("speaker"))).server.tls
        assert speaker.server_name == "shared.internal" and speaker.client_cert_file == ""
        # false and "" win too
        r = render({**form, "tls": {"existingSecret": "s", "mutual": True},
                    "director": {"config": {"server": {"tls": {"client_auth": False, "ca_file": ""}}}}})
        assert r.service_of("director") == ("generation" if generation else "director")
        director = MascotConfig.model_validate(component_config(r, r.service_of("director"))).server.tls
        assert director.enabled and director.client_auth is False and director.ca_file == ""
        unchanged = "reward" if generation else "speaker"  # a service that does not serve the director
        assert MascotConfig.model_validate(component_config(r, unchanged)).server.tls.client_auth is True


def test_a_secret_without_ca_verifies_with_the_system_roots():
    from mascot.core.config import MascotConfig

    r = render({"tls": {"existingSecret": "public-cert", "hasCA": False}})
    assert r.services == ["generation", "reward"]
    for comp in ("gateway", *r.services):
        tls = MascotConfig.model_validate(component_config(r, comp)).server.tls
        assert tls.enabled and tls.ca_file == "" and not tls.client_auth
    spec = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert [i["key"] for i in vol["secret"]["items"]] == ["tls.crt", "tls.key"]


# ----------------------------------------------------------------------------------------------- probes
@pytest.mark.parametrize("ci", CI_IDS)
def test_grpc_probes_are_mascot_health_exec_probes_under_tls_and_grpc_probes_otherwise(rendered, ci):
    r = rendered[ci]
    pods = workloads(r)
    for comp, (spec, c) in pods.items():
        if comp == "test":
            continue
        port = grpc_port(c)
        grpc_probes = (("startupProbe", "readinessProbe", "livenessProbe") if comp in ("gateway", "control")
                       else ("readinessProbe",))
        for name in grpc_probes:
            probe = c[name]
            if TLS_ON[ci]:
                assert "grpc" not in probe, (comp, name)
                cmd = probe["exec"]["command"]
                assert cmd[:4] == ["mascot", "health", "--port", str(port)], (comp, name)
                cli_accepts(cmd[1:])  # the real CLI takes these options
                timeout = float(cmd[cmd.index("--timeout") + 1])
                assert timeout < probe["timeoutSeconds"] or timeout == 1, "the Check ends before the kubelet kills"
                # what `mascot health` reads: the pod's MASCOT_CONFIG and the mounted Secret
                assert "MASCOT_CONFIG" in {e["name"] for e in c["env"]}
                assert "tls" in {m["name"] for m in c["volumeMounts"]}
            else:
                assert probe["grpc"] == {"port": port} and "exec" not in probe, (comp, name)
            assert probe["periodSeconds"] > 0 and probe["failureThreshold"] > 0
        if comp not in ("gateway", "control"):  # KServe's REST port stays plaintext: startup and liveness on HTTP
            assert c["startupProbe"]["httpGet"]["path"] == c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


@pytest.mark.parametrize("generation", [True, False], ids=["generation", "per-component"])
def test_model_deployments_without_kserve_get_exec_probes_under_tls(generation):
    base = {"kserve": {"enabled": False}, "model": {"storageUri": ""}, "reward": {"storageUri": ""},
            "generation": {"enabled": generation}}
    r = render({**base, "tls": {"existingSecret": "mascot-tls"}})
    assert r.services == (["generation", "reward"] if generation else list(MODEL_COMPONENTS))
    for comp in r.services:
        (c,) = r.one("Deployment", f"-{comp}")["spec"]["template"]["spec"]["containers"]
        assert c["readinessProbe"]["exec"]["command"][:4] == ["mascot", "health", "--port", str(grpc_port(c))]
    plain = render(base)
    assert not plain.one("Deployment", f"-{plain.service_of('judge')}")["spec"]["template"]["spec"]["containers"][0][
        "readinessProbe"].get("exec")


# ----------------------------------------------------------------------------------------------- against real servers
def _pki(d: Path, names: list[str]) -> Path:
    """The TLS Secret as the pod sees it: <d>/tls.crt, tls.key (valid for ``names`` only, server and client
    authentication) and ca.crt. Returns ``d``."""
    from tests.helpers.pki import make_ca, make_cluster_leaf

    ca_key, ca = make_ca(d / "ca", "chart test CA")
    leaf = make_cluster_leaf(d / "leaf", names, ca_key, ca)
    secret = d / "secret"
    secret.mkdir()
    shutil.copy(d / "ca" / "tls.crt", secret / "ca.crt")
    shutil.copy(leaf.cert, secret / "tls.crt")
    shutil.copy(leaf.key, secret / "tls.key")
    return secret


def _as_pod_sees_it(r, key: str, secret: Path, path: Path) -> Path:
    """The rendered ConfigMap entry ``key`` with the TLS mount path pointed at ``secret``, written to ``path``."""
    text = r.one("ConfigMap", "-config")["data"][key].replace(tls_values(r)["mountPath"].rstrip("/"), str(secret))
    path.write_text(text)
    return path


def _tls_health_server(cfg_file: Path, host: str = "127.0.0.1"):
    """A gRPC health server with the server.tls of a rendered config (mascot.core.server.server_credentials)."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from mascot.core.config import MascotConfig
    from mascot.core.server import server_credentials

    tls = MascotConfig.model_validate(yaml.safe_load(cfg_file.read_text())).server.tls
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port(f"{host}:0", server_credentials(tls))
    server.start()
    return server, servicer, port


def _run(argv: list[str], config: Path) -> subprocess.CompletedProcess:
    """A rendered `mascot ...` command run as the container would (MASCOT_CONFIG = ``config``)."""
    assert argv[0] == "mascot"
    return subprocess.run([sys.executable, "-m", "mascot.cli", *argv[1:]], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "MASCOT_CONFIG": str(config)})


def test_rendered_probe_and_helm_test_commands_pass_against_mutual_tls_servers(rendered, tmp_path):
    """full.yaml (mutual TLS, tls.serverName): a server started with the director's rendered server.tls passes the
    director's rendered readiness probe and the gateway's probe; the `helm test` command, with the gateway's config,
    passes against a server on another address (checked against tls.serverName, as the gateway checks the model
    services); NOT_SERVING, a plaintext config and a config without the client certificate fail."""
    from grpc_health.v1 import health_pb2

    r = rendered["full.yaml"]
    server_name = tls_values(r)["serverName"]
    secret = _pki(tmp_path, [server_name])  # no 127.0.0.1 in it: the probe checks the certificate's own name
    director_cfg = _as_pod_sees_it(r, "director.yaml", secret, tmp_path / "director.yaml")
    gateway_cfg = _as_pod_sees_it(r, "gateway.yaml", secret, tmp_path / "gateway.yaml")
    server, servicer, port = _tls_health_server(director_cfg)
    remote, _, remote_port = _tls_health_server(gateway_cfg, host="127.0.0.2")  # stands for a Service address
    try:
        (c,) = r.one("InferenceService", "-director")["spec"]["predictor"]["containers"]
        probe = [str(port) if a == str(grpc_port(c)) else a for a in c["readinessProbe"]["exec"]["command"]]
        ok = _run(probe, director_cfg)
        assert ok.returncode == 0 and ok.stdout.strip() == f"127.0.0.1:{port} SERVING", ok.stderr
        gw = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
        gw_probe = [str(port) if a == str(grpc_port(gw)) else a for a in gw["livenessProbe"]["exec"]["command"]]
        assert _run(gw_probe, gateway_cfg).returncode == 0

        (t,) = r.one("Pod", "-test-health")["spec"]["containers"]
        targets = t["args"][3::2]
        args = [f"127.0.0.2:{remote_port}" if a in targets else a for a in t["args"]]
        test_run = _run(t["command"] + args, gateway_cfg)
        assert test_run.returncode == 0, test_run.stdout + test_run.stderr
        assert test_run.stdout.count("SERVING") == len(targets)

        # a plaintext client (a release rendered without TLS) and a TLS client without the client certificate fail
        plain = _as_pod_sees_it(rendered["minimal.yaml"], "gateway.yaml", secret, tmp_path / "plain.yaml")
        no_cert = _as_pod_sees_it(render({"tls": {"existingSecret": "mascot-tls"}}), "gateway.yaml", secret,
                                  tmp_path / "no-cert.yaml")
        for config in (plain, no_cert):
            bad = _run(probe, config)
            assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, (config, bad.stderr)
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        down = _run(probe, director_cfg)
        assert down.returncode == 1 and "NOT_SERVING" in down.stderr
    finally:
        server.stop(0)
        remote.stop(0)


# ----------------------------------------------------------------------------------------------- caller tokens
def test_caller_token_secret_is_mounted_in_the_gateway_and_named_by_its_config(rendered, tmp_path):
    from mascot.core.config import MascotConfig
    from mascot.gateway.security import CallerAuth

    r = rendered["full.yaml"]
    ca = load_ci("full.yaml")["security"]["callerAuth"]
    spec = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "caller-tokens"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "caller-tokens"]
    assert vol["secret"]["secretName"] == ca["existingSecret"] and mount["readOnly"] is True
    (item,) = vol["secret"]["items"]
    assert item["key"] == ca.get("key", "tokens") and vol["secret"]["defaultMode"] == 0o440
    cfg = MascotConfig.model_validate(component_config(r, "gateway"))
    assert cfg.security.caller_auth is True
    assert cfg.security.caller_tokens_file == f"{mount['mountPath']}/{item['path']}"
    # the gateway reads that file as the Secret's key lays it out
    (tmp_path / item["path"]).write_text("alice=alice-token-0123456789\n# a comment\nbob=bob-token-0123456789\n")
    sec = cfg.security.model_copy(update={"caller_tokens_file": str(tmp_path / item["path"])})
    assert CallerAuth.from_config(sec, environ={}).enabled
    # the gateway only: model services, the test Pod and the Jobs neither mount it nor name it
    for comp, (pod, c) in workloads(r).items():
        if comp != "gateway":
            assert "caller-tokens" not in {v["name"] for v in pod["volumes"]}, comp
            assert "security" not in config_of(r, c)[1] or comp == "test", comp
    for ci in CI_IDS:
        if not (rendered[ci].values.get("security") or {}).get("callerAuth", {}).get("enabled"):
            assert "security" not in component_config(rendered[ci], "gateway"), ci
            gw = rendered[ci].one("Deployment", "-gateway")["spec"]["template"]["spec"]
            assert "caller-tokens" not in {v["name"] for v in gw["volumes"]}, ci


def test_caller_token_values_never_reach_a_configmap_or_env(rendered):
    r = render({"security": {"callerAuth": {"enabled": True, "existingSecret": "callers", "key": "callers.txt"}}})
    spec = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "caller-tokens"]
    assert vol["secret"]["items"] == [{"key": "callers.txt", "path": "tokens"}]
    assert component_config(r, "gateway")["security"] == {"caller_auth": True,
                                                 "caller_tokens_file": "/etc/mascot/caller-tokens/tokens"}
    for _, obj in r.objects:
        for _, pod in pod_specs(obj):
            for c in pod["containers"]:
                assert "MASCOT_CALLER_TOKENS" not in {e["name"] for e in c.get("env", [])}
    assert not r.of_kind("Secret")


# ----------------------------------------------------------------------------------------------- values.schema.json
def test_schema_rejects_mutual_tls_without_the_tls_secret():
    rejected({"tls": {"mutual": True}}, "/tls/existingSecret", "minLength")


def test_schema_rejects_mutual_tls_without_a_ca():
    rejected({"tls": {"existingSecret": "mascot-tls", "mutual": True, "hasCA": False}}, "/tls/hasCA", "true")


def test_schema_rejects_a_server_name_without_tls():
    rejected({"tls": {"serverName": "mascot-internal"}}, "/tls/existingSecret", "minLength")


def test_schema_rejects_a_server_name_that_is_not_a_dns_name():
    rejected({"tls": {"existingSecret": "mascot-tls", "serverName": "https://mascot"}}, "/tls/serverName",
             "pattern")


def test_schema_rejects_tls_enabled_which_existing_secret_implies():
    rejected({"tls": {"enabled": True}}, "/tls", "enabled")


def test_schema_rejects_caller_auth_without_its_secret():
    rejected({"security": {"callerAuth": {"enabled": True}}}, "/security/callerAuth/existingSecret", "minLength")


def test_schema_rejects_a_caller_token_value_in_values():
    rejected({"security": {"callerAuth": {"enabled": True, "existingSecret": "t", "tokens": "alice=secret"}}},
             "/security/callerAuth", "tokens")


@pytest.mark.parametrize("values, where", [
    ({"tls": {"existingSecret": "Bad_Name!"}}, "/tls/existingSecret"),
    ({"security": {"callerAuth": {"enabled": True, "existingSecret": "-starts-with-dash"}}},
     "/security/callerAuth/existingSecret"),
], ids=["tls-secret", "caller-token-secret"])
def test_schema_rejects_a_secret_name_kubernetes_would_refuse(values, where):
    rejected(values, where, "pattern")


def test_schema_accepts_tls_and_caller_auth_with_their_secrets():
    r = render({"tls": {"existingSecret": "mascot-tls", "mutual": True, "serverName": "mascot-internal.mascot.svc"},
                "security": {"callerAuth": {"enabled": True, "existingSecret": "callers"}}})
    assert component_config(r, "gateway")["server"]["tls"]["client_auth"] is True
    assert r.one("Deployment", "-gateway")["metadata"]["name"] == f"{RELEASE}-mascot-gateway"
