"""mascot.gateway.jobs without an API server: templates, run ids, the Job built for a run, the status mapping, and the
finished-run counter of TrainingService."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from mascot.gateway import jobs
from mascot.core.errors import InvalidArgument
from mascot.core.metrics import Metrics
from tests.helpers.paths import ROOT

T0 = dt.datetime(2025, 5, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def test_the_shipped_templates_load_and_leave_room_for_a_run_id():
    for phase in jobs.PHASES:
        path = jobs.template_path(ROOT / "training-jobs" / "k8s", phase)
        assert path is not None and path.name == f"{phase}-job.yaml"
        job = jobs.load_template(path)
        assert job["metadata"]["name"] == f"mascot-{phase}" and "status" not in job
        assert jobs.max_run_id_len(job["metadata"]["name"]) >= 20


@pytest.mark.parametrize("text,fragment", [
    ("kind: Deployment\napiVersion: apps/v1\nmetadata: {name: x}\n", "not a batch/v1 Job"),
    ("apiVersion: batch/v1\nkind: Job\nmetadata: {name: Bad_Name}\nspec: {template: {}}\n", "DNS-1123"),
    ("apiVersion: batch/v1\nkind: Job\nmetadata: {name: " + "a" * 59 + "}\nspec: {template: {}}\n", "at most 58"),
    ("apiVersion: batch/v1\nkind: Job\nmetadata: {name: ok}\nspec: {}\n", "no spec.template"),
    ("a: 1\n---\nb: 2\n", "exactly one object"),
    ("a: [1\n", "Job template"),
])
def test_bad_templates_are_refused(tmp_path, text, fragment):
    p = tmp_path / "persona-alignment.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        jobs.load_template(p)


def test_run_ids_are_dns_labels_that_fit_the_job_name():
    prefix = "demo-mascot-persona-alignment"  # 29 characters: 33 left for the run id
    assert jobs.validate_run_id("nightly-2025-05-01", prefix) == "nightly-2025-05-01"
    for bad in ("", "Upper", "under_score", "-lead", "trail-", "a.b", "x" * 34):
        with pytest.raises(InvalidArgument):
            jobs.validate_run_id(bad, prefix)
    assert jobs.validate_run_id("x" * 33, prefix)
    rid = jobs.generate_run_id(prefix, T0)
    assert rid.startswith("20250501-120000-") and len(rid) == 20 and jobs.DNS1123_LABEL.match(rid)
    long_prefix = "x" * 40 + "-persona-alignment"  # the chart's worst case (fullname of 40 characters)
    short = jobs.generate_run_id(long_prefix, T0)
    assert len(short) == 4 and jobs.validate_run_id(short, long_prefix)
    assert len(f"{long_prefix}-{short}") == 63


def test_the_job_of_a_run_is_named_and_labelled_from_the_template():
    template = jobs.load_template(ROOT / "training-jobs" / "k8s" / "collaborative-job.yaml")
    job = jobs.job_from_template(template, "collaborative", "r1", "ns1", T0)
    meta = job["metadata"]
    assert meta["name"] == "mascot-collaborative-r1" and meta["namespace"] == "ns1"
    assert meta["labels"][jobs.LABEL_PHASE] == "collaborative" and meta["labels"][jobs.LABEL_RUN_ID] == "r1"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "mascot-gateway"
    assert meta["labels"]["app.kubernetes.io/component"] == "training"
    assert meta["annotations"][jobs.ANNOTATION_CREATED] == "2025-05-01T12:00:00Z"
    pod = job["spec"]["template"]["metadata"]["labels"]
    assert pod[jobs.LABEL_RUN_ID] == "r1" and pod["app.kubernetes.io/component"] == "training"
    assert template["metadata"]["name"] == "mascot-collaborative"  # the template itself is untouched


def _job(status=None, **meta):
    return {"metadata": {"name": "p-r1", "namespace": "ns", "labels": {jobs.LABEL_RUN_ID: "r1",
                                                                       jobs.LABEL_PHASE: "collaborative"},
                         "creationTimestamp": "2025-05-01T12:00:00Z", **meta}, "status": status or {}}


def _cond(kind, **kw):
    return {"type": kind, "status": "True", **kw}


@pytest.mark.parametrize("status,meta,state,fragment", [
    ({}, {}, "pending", "waiting for a pod"),
    ({"active": 1, "ready": 0}, {}, "pending", "not ready yet"),
    ({"active": 1, "ready": 1, "startTime": "2025-05-01T12:00:05Z"}, {}, "running", "1 pod(s) running"),
    ({"active": 1}, {}, "running", "running"),  # an API without status.ready
    ({"failed": 2}, {}, "pending", "2 failed so far"),
    ({"conditions": [_cond("Suspended", reason="JobSuspended")]}, {}, "pending", "suspended"),
    ({"conditions": [_cond("FailureTarget", reason="BackoffLimitExceeded")]}, {}, "running", "finishing"),
    ({"conditions": [_cond("Complete")], "completionTime": "2025-05-01T13:00:00Z"}, {}, "succeeded", "staged"),
    ({"conditions": [_cond("Failed", reason="DeadlineExceeded", message="Job was active longer than specified",
                           lastTransitionTime="2025-05-01T14:00:00Z")]}, {}, "failed", "DeadlineExceeded: Job was"),
    ({"conditions": [{"type": "Complete", "status": "False"}], "active": 1}, {}, "running", "running"),
    ({"active": 1, "ready": 1}, {"deletionTimestamp": "2025-05-01T12:30:00Z"}, "cancelled", "being deleted"),
])
def test_status_follows_the_job(status, meta, state, fragment):
    run = jobs.run_status(_job(status, **meta))
    assert (run.state, run.run_id, run.phase, run.job_name) == (state, "r1", "collaborative", "p-r1")
    assert fragment in run.message
    assert run.finished is (state in ("succeeded", "failed", "cancelled"))
    assert run.create_time == dt.datetime(2025, 5, 1, 12, tzinfo=dt.timezone.utc)
    if state in ("succeeded", "failed", "cancelled"):
        assert run.finish_time is not None and run.finish_time > run.create_time


def test_finished_runs_are_counted_once_and_not_before_the_start():
    from mascot.gateway.training import FinishedRuns

    m = Metrics()
    counter = FinishedRuns(m, since=T0)

    def value(result):
        return m.registry.get_sample_value("mascot_training_runs_total",
                                           {"phase": "collaborative", "result": result}) or 0.0

    def run(rid, state, finish):
        return jobs.RunStatus(run_id=rid, phase="collaborative", job_name=f"p-{rid}", namespace="ns", state=state,
                              create_time=T0, finish_time=finish)

    counter.observe(run("old", "succeeded", T0 - dt.timedelta(hours=1)))  # finished before the gateway started
    counter.observe(run("a", "running", None))
    assert value("succeeded") == 0
    for _ in range(3):
        counter.observe(run("a", "succeeded", T0 + dt.timedelta(minutes=5)))
    assert value("succeeded") == 1
    counter.observe(run("b", "failed", T0 + dt.timedelta(minutes=6)))
    assert value("failed") == 1
    # a run seen running whose Job disappears from a full listing was deleted behind our back: cancelled
    counter.observe_all([run("c", "running", None), run("d", "pending", None)])
    counter.observe_all([run("d", "pending", None)])
    assert value("cancelled") == 1
    counter.observe_all([])
    assert value("cancelled") == 2 and value("succeeded") == 1


def test_a_chart_style_template_with_a_long_release_name_still_fits(tmp_path):
    doc = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "r" * 40 + "-persona-alignment", "namespace": "mascot"},
           "spec": {"template": {"spec": {"containers": []}}}}
    (tmp_path / "persona-alignment.yaml").write_text(yaml.safe_dump(doc))
    job = jobs.load_template(jobs.template_path(tmp_path, "persona-alignment"))
    assert jobs.max_run_id_len(job["metadata"]["name"]) == 4
