"""TrainingService on the gateway over real gRPC, against kmock (a stateful Kubernetes API emulator): the chart's Job
templates instantiated per run id, dedupe, status following the Job, list, cancel, the concurrency limit, bad input
and auth, mascot_training_runs_total, and `mascot retrain ... --wait`.

kmock has no controllers: the tests patch each Job's status (the Job controller's part) themselves. It also ignores
label selectors on lists (it returns every Job of the namespace), which mascot.gateway.jobs re-checks on its side, and
deletes a Job at once whatever the propagation policy (a real API server keeps a Foreground-deleted Job, marked with
deletionTimestamp, until its pods are gone: :func:`mascot.gateway.jobs.run_status` reports that as cancelled). It
sets no ``creationTimestamp``/``uid`` (ListRuns orders by the ``mascot.ai/create-time`` annotation jobs.py writes) and
answers a list of a resource it has no object of with 404 unless the resource is declared (the ``kube`` fixture of
tests/integration/conftest.py declares batch/v1 jobs)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from types import SimpleNamespace

import grpc
import pytest

from mascot.api.training.v1 import training_pb2 as pb
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.kube import AUTH, NS, TOKEN, write_kubeconfig
from tests.helpers.paths import ROOT
from tests.helpers.rpc import code_of

pytestmark = pytest.mark.integration
PA, COLLAB = pb.TRAINING_PHASE_PERSONA_ALIGNMENT, pb.TRAINING_PHASE_COLLABORATIVE
PREFIX = "demo-mascot-persona-alignment"


# ------------------------------------------------------------------------------------------------------ create
async def test_trigger_creates_one_job_per_run_id_from_the_chart_template(envs):
    env = await envs(max_active_runs=2)
    r = await env.trigger("nightly-1")
    run = r.run
    assert not r.already_existed
    assert (run.run_id, run.phase, run.state, run.job_name, run.namespace) == (
        "nightly-1", PA, pb.RUN_STATE_PENDING, f"{PREFIX}-nightly-1", NS)
    assert run.HasField("create_time") and not run.HasField("finish_time")
    (job,) = await env.jobs()
    meta = job["metadata"]
    assert meta["name"] == f"{PREFIX}-nightly-1"
    assert meta["labels"]["mascot.ai/run-id"] == "nightly-1"
    assert meta["labels"]["mascot.ai/phase"] == "persona-alignment"
    assert meta["labels"]["app.kubernetes.io/instance"] == "demo"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "mascot-gateway"
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["mascot.ai/run-id"] == "nightly-1" and pod_labels["app.kubernetes.io/component"] == "training"
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"][-2:] == ["--out", "/runs/persona-alignment/$(MASCOT_RUN_ID)"]  # the chart's run directory

    # dedupe: the same run id again returns the same run and creates nothing
    again = await env.trigger("nightly-1")
    assert again.already_existed and again.run.job_name == run.job_name and again.run.create_time == run.create_time
    assert len(await env.jobs()) == 1

    # a generated run id: <UTC yyyymmdd-hhmmss>-<4 hex>
    gen = (await env.trigger()).run
    assert len(gen.run_id) == 20 and gen.run_id[:8].isdigit() and gen.job_name == f"{PREFIX}-{gen.run_id}"
    assert len(await env.jobs()) == 2
    # the same run id in the other phase is another run's: ALREADY_EXISTS
    code, msg = await code_of(env.trigger("nightly-1", phase=COLLAB))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "persona-alignment" in msg


async def test_status_follows_the_job(envs):
    env = await envs(max_active_runs=3)
    job = (await env.trigger("s1")).run.job_name
    assert (await env.get("s1")).state == pb.RUN_STATE_PENDING
    await env.set_status(job, "pending")
    run = await env.get("s1")
    assert run.state == pb.RUN_STATE_PENDING and "not ready" in run.message and run.active_pods == 1
    await env.set_status(job, "running")
    run = await env.get("s1")
    assert run.state == pb.RUN_STATE_RUNNING and run.HasField("start_time") and not run.HasField("finish_time")
    await env.set_status(job, "succeeded")
    run = await env.get("s1")
    assert run.state == pb.RUN_STATE_SUCCEEDED and run.HasField("finish_time")
    assert run.finish_time.ToDatetime() >= run.start_time.ToDatetime()

    job2 = (await env.trigger("f1", phase=COLLAB)).run.job_name
    await env.set_status(job2, "failed")
    run = await env.get("f1")
    assert run.state == pb.RUN_STATE_FAILED and run.phase == COLLAB and run.failed_pods == 4
    assert run.message.startswith("BackoffLimitExceeded: Job has reached")


async def test_list_newest_first_by_phase_with_a_limit(envs):
    env = await envs(max_active_runs=5)
    for rid, phase in [("l1", PA), ("l2", COLLAB), ("l3", PA)]:
        await env.trigger(rid, phase=phase)
    # a Job without our labels (another tool's) is not a run
    await asyncio.to_thread(env.batch.create_namespaced_job, NS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "unrelated", "namespace": NS},
        "spec": {"template": {"spec": {"containers": []}}}}, _preload_content=False)

    async def ids(**kw):
        r = await env.stub.ListRuns(pb.ListRunsRequest(**kw), metadata=AUTH)
        return [x.run_id for x in r.runs]

    assert await ids() == ["l3", "l2", "l1"]
    assert await ids(phase=PA) == ["l3", "l1"]
    assert await ids(phase=COLLAB) == ["l2"]
    assert await ids(limit=2) == ["l3", "l2"]
    # the selector is sent to the API server (kmock itself ignores it)
    lists = [r for r in list(env.kmock) if r.action is not None and r.action.name == "LIST"]
    assert any("mascot.ai/run-id" in r.params.get("labelSelector", "") and
               "app.kubernetes.io/instance=demo" in r.params.get("labelSelector", "") for r in lists)


async def test_cancel_deletes_the_job_and_the_run_stays_cancelled(envs, kube):
    from kubernetes.client.exceptions import ApiException

    env = await envs(max_active_runs=3, cancel_propagation="Foreground")
    job = (await env.trigger("c1")).run.job_name
    await env.set_status(job, "running")
    r = await env.stub.CancelRun(pb.CancelRunRequest(run_id="c1"), metadata=AUTH)
    assert r.run.state == pb.RUN_STATE_CANCELLED and not r.already_cancelled and r.run.HasField("finish_time")
    deletes = [q for q in list(env.kmock) if q.action is not None and q.action.name == "DELETE"]
    assert deletes and deletes[-1].name == job
    assert deletes[-1].params.get("propagationPolicy") == "Foreground"  # the pods go with the Job
    with pytest.raises(ApiException) as e:
        await asyncio.to_thread(env.batch.read_namespaced_job, job, NS)
    assert e.value.status == 404
    run = await env.get("c1")
    assert run.state == pb.RUN_STATE_CANCELLED and run.job_name == job
    assert [x.run_id for x in (await env.stub.ListRuns(pb.ListRunsRequest(), metadata=AUTH)).runs] == []
    again = await env.stub.CancelRun(pb.CancelRunRequest(run_id="c1"), metadata=AUTH)
    assert again.already_cancelled and again.run.state == pb.RUN_STATE_CANCELLED

    # a finished run cannot be cancelled; an unknown one is NOT_FOUND
    done = (await env.trigger("c2")).run.job_name
    await env.set_status(done, "succeeded")
    code, msg = await code_of(env.stub.CancelRun(pb.CancelRunRequest(run_id="c2"), metadata=AUTH))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "succeeded" in msg
    code, _ = await code_of(env.stub.CancelRun(pb.CancelRunRequest(run_id="nope"), metadata=AUTH))
    assert code == grpc.StatusCode.NOT_FOUND
    # a cancelled run id can be triggered again: a new Job (the run directory resumes)
    r = await env.trigger("c1")
    assert not r.already_existed and r.run.state == pb.RUN_STATE_PENDING
    assert (await env.get("c1")).state == pb.RUN_STATE_PENDING


async def test_concurrency_limit_per_phase(envs):
    env = await envs(max_active_runs=1)
    first = (await env.trigger("a1")).run.job_name
    await env.set_status(first, "running")
    code, msg = await code_of(env.trigger("a2"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "a1" in msg and "max_active_runs" in msg
    assert len(await env.jobs()) == 1
    # the same run id is not a new run: still answered
    assert (await env.trigger("a1")).already_existed
    # another phase has its own limit
    assert not (await env.trigger("b1", phase=COLLAB)).already_existed
    await env.set_status(first, "succeeded")
    assert not (await env.trigger("a2")).already_existed
    assert len(await env.jobs()) == 3


async def test_bad_input_and_auth(envs):
    env = await envs()
    cases = [
        (env.stub.TriggerRetraining(pb.TriggerRetrainingRequest(run_id="x"), metadata=AUTH),
         grpc.StatusCode.INVALID_ARGUMENT, "TRAINING_PHASE_PERSONA_ALIGNMENT"),
        (env.stub.TriggerRetraining(pb.TriggerRetrainingRequest(phase=7, run_id="x"), metadata=AUTH),
         grpc.StatusCode.INVALID_ARGUMENT, "got 7"),
        (env.stub.TriggerRetraining(pb.TriggerRetrainingRequest(phase=PA, run_id="Bad_Id"), metadata=AUTH),
         grpc.StatusCode.INVALID_ARGUMENT, "DNS-1123"),
        (env.stub.TriggerRetraining(pb.TriggerRetrainingRequest(phase=PA, run_id="x" * 34), metadata=AUTH),
         grpc.StatusCode.INVALID_ARGUMENT, "at most 33"),
        (env.stub.GetRun(pb.GetRunRequest(run_id=""), metadata=AUTH), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (env.stub.GetRun(pb.GetRunRequest(run_id="unknown-run"), metadata=AUTH), grpc.StatusCode.NOT_FOUND,
         "unknown-run"),
        (env.stub.ListRuns(pb.ListRunsRequest(limit=-1), metadata=AUTH), grpc.StatusCode.INVALID_ARGUMENT, "limit"),
        (env.stub.ListRuns(pb.ListRunsRequest(phase=9), metadata=AUTH), grpc.StatusCode.INVALID_ARGUMENT, "phase"),
        (env.stub.ListRuns(pb.ListRunsRequest()), grpc.StatusCode.UNAUTHENTICATED, "MASCOT_ADMIN_TOKEN"),
        (env.stub.TriggerRetraining(pb.TriggerRetrainingRequest(phase=PA, run_id="x")),
         grpc.StatusCode.UNAUTHENTICATED, "admin token"),
        (env.stub.GetRun(pb.GetRunRequest(run_id="x"), metadata=(("authorization", "Bearer wrong"),)),
         grpc.StatusCode.UNAUTHENTICATED, "not valid"),
    ]
    for call, want, fragment in cases:
        code, msg = await code_of(call)
        assert code == want and fragment in msg, (want, msg)
        assert TOKEN not in msg
    assert await env.jobs() == []  # nothing was created


async def test_a_phase_without_template_and_the_shipped_templates(envs, tmp_path):
    # training-jobs/k8s: <phase>-job.yaml without a namespace: the kubeconfig context's (default) is used
    only = tmp_path / "only-collab"
    only.mkdir()
    (only / "collaborative-job.yaml").write_text((ROOT / "training-jobs/k8s/collaborative-job.yaml").read_text())
    env = await envs(templates_dir=only)
    run = (await env.trigger("k1", phase=COLLAB)).run
    assert (run.job_name, run.namespace) == ("mascot-collaborative-k1", "default")
    assert len(await env.jobs("default")) == 1
    code, msg = await code_of(env.trigger("k2", phase=PA))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "no Job template" in msg


async def test_kubernetes_api_failures_are_unavailable_with_the_reason(envs, kmock, tmp_path):
    env = await envs()
    kmock["list"] << 403 << {"apiVersion": "v1", "kind": "Status", "code": 403, "reason": "Forbidden",
                             "message": 'jobs.batch is forbidden: User "system:serviceaccount:mascot:x" cannot '
                                        'list resource "jobs"'}
    code, msg = await code_of(env.trigger("u1"))
    assert code == grpc.StatusCode.UNAVAILABLE and "403" in msg and "cannot list resource" in msg and "Role" in msg

    dead = await envs(kubeconfig=str(write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9")),
                      request_timeout_s=5)
    code, msg = await code_of(dead.stub.GetRun(pb.GetRunRequest(run_id="u1"), metadata=AUTH))
    assert code == grpc.StatusCode.UNAVAILABLE and "unreachable" in msg and "127.0.0.1:9" in msg


# ------------------------------------------------------------------------------------------------------ metric
async def test_runs_total_counts_each_finished_run_once(envs):
    env = await envs(max_active_runs=3)
    ok = (await env.trigger("m1")).run.job_name
    bad = (await env.trigger("m2")).run.job_name
    await env.trigger("m3")
    await env.set_status(ok, "succeeded")
    assert env.runs_total("succeeded") == 0  # not observed yet
    assert (await env.get("m1")).state == pb.RUN_STATE_SUCCEEDED
    assert env.runs_total("succeeded") == 1
    await env.get("m1")
    await env.stub.ListRuns(pb.ListRunsRequest(), metadata=AUTH)
    assert env.runs_total("succeeded") == 1  # once per run, however often it is seen
    await env.set_status(bad, "failed")
    await env.stub.ListRuns(pb.ListRunsRequest(), metadata=AUTH)
    assert env.runs_total("failed") == 1 and env.runs_total("succeeded") == 1
    await env.stub.CancelRun(pb.CancelRunRequest(run_id="m3"), metadata=AUTH)
    await env.get("m3")
    assert env.runs_total("cancelled") == 1


async def test_the_background_poll_counts_runs_nobody_asks_about(envs):
    env = await envs(max_active_runs=2, poll_s=0.05)
    job = (await env.trigger("p1", phase=COLLAB)).run.job_name
    await env.set_status(job, "succeeded")
    for _ in range(200):  # wait for the poll (bounded), not for a fixed time
        if env.runs_total("succeeded", "collaborative") == 1:
            break
        await asyncio.sleep(0.02)
    assert env.runs_total("succeeded", "collaborative") == 1


# ------------------------------------------------------------------------------------------------------ CLI
async def _cli(env, *args, wait_for: list[tuple[str, str, str]] = (), component: str = "control"):
    """Run `mascot retrain ...` in a subprocess; for each (text, job, state) in ``wait_for``, once ``text`` appears
    on its stderr, patch ``job`` to ``state``. Returns (exit code, stdout, stderr)."""
    envs_ = {**os.environ, "MASCOT_ADMIN_TOKEN": TOKEN, "COLUMNS": "400"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mascot.cli", "retrain", *args, "--target", env.stack.target(component),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=envs_, cwd=ROOT)
    err = ""
    steps = list(wait_for)

    async def read_err():
        nonlocal err
        while line := await proc.stderr.readline():
            err += line.decode()
            while steps and steps[0][0] in err:
                _, job, state = steps.pop(0)
                await env.set_status(job, state)

    out, _ = await asyncio.wait_for(asyncio.gather(proc.stdout.read(), read_err()), 60)
    rc = await proc.wait()
    return rc, out.decode(), err


async def test_cli_retrain_wait_follows_the_run_to_its_end(envs):
    env = await envs(max_active_runs=2)
    job = f"{PREFIX}-cli-ok"
    rc, out, err = await _cli(env, "persona-alignment", "--run-id", "cli-ok", "--wait", "--poll-s", "0.05",
                              wait_for=[("triggered: run cli-ok", job, "running"), (": running", job, "succeeded")])
    assert rc == 0, err
    assert out.strip() == "cli-ok"
    assert ": pending" in err and ": running" in err and ": succeeded" in err and "staged" in err

    rc, out, err = await _cli(env, "status", "cli-ok", "--json")
    assert rc == 0 and json.loads(out)["state"] == "RUN_STATE_SUCCEEDED"
    rc, out, err = await _cli(env, "list", "--json")
    assert rc == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == ["cli-ok"]

    # a failed run: --wait exits 1
    job = "demo-mascot-collaborative-cli-bad"
    rc, out, err = await _cli(env, "collaborative", "--run-id", "cli-bad", "--wait", "--poll-s", "0.05",
                              wait_for=[("triggered: run cli-bad", job, "failed")])
    assert rc == 1 and ": failed - BackoffLimitExceeded" in err
    rc, out, err = await _cli(env, "list", "--phase", "collaborative", "--json")
    assert rc == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == ["cli-bad"]

    # cancel from the CLI; a finished run cannot be cancelled (exit 1 with the code)
    rc, out, err = await _cli(env, "persona-alignment", "--run-id", "cli-c")
    assert rc == 0 and out.strip() == "cli-c"
    rc, out, err = await _cli(env, "cancel", "cli-c")
    assert rc == 0 and "cancelled: run cli-c" in err
    rc, out, err = await _cli(env, "cancel", "cli-ok")
    assert rc == 1 and "FAILED_PRECONDITION" in err
    assert env.runs_total("succeeded") == 1 and env.runs_total("failed", "collaborative") == 1
    assert env.runs_total("cancelled") == 1


async def test_cli_against_a_plane_without_training_service_says_how_to_turn_it_on(engine, tmp_path):
    """A control plane with adapters only, and the gateway's public port (which never serves the admin services):
    the CLI says the address serves no TrainingService and how to get one."""
    cfg = make_config(tmp_path, adapters={"store": str(tmp_path / "store")})  # no training.templates_dir
    stack = await start_stack(cfg, engine=engine)
    try:
        for component in ("control", "gateway"):
            rc, out, err = await _cli(SimpleNamespace(stack=stack), "list", component=component)
            assert rc == 1 and "serves no TrainingService" in err and "training.templates_dir" in err, err
            assert "control.port" in err and "Traceback" not in err
    finally:
        await stack.stop(0)
