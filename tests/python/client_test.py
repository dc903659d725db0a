"""The megatrain Python client against a real megatraind (started by client_test.sh).

Every wait is on a job state or a progress event, bounded by a watch deadline; none on
elapsed time. Environment: MEGATRAIN_SOCKET, MEGATRAIN_WORK (the daemon's temp dir with
data/config.json, data/corpus.txt and out/), MEGATRAIN_ADDRESS, MEGATRAIN_TOKEN_FILE,
MEGATRAIN_CA_FILE (its TLS listener), MEGATRAIN_VENV (where pip installed the package).
"""
import json
import math
import os
import sys

import grpc
import pytest

import megatrain
from megatrain import pb

SOCKET = os.environ["MEGATRAIN_SOCKET"]
WORK = os.environ["MEGATRAIN_WORK"]
WATCH_TIMEOUT = 240  # seconds: a bound on each whole watch, not a wait


@pytest.fixture(scope="module")
def client():
    with megatrain.Client(socket=SOCKET, wait_seconds=20) as c:
        yield c


def spec(name, steps, **extra):
    """A small job of the tiny test model (the shell tests' e2e job), as a spec-file dict."""
    s = {
        "name": name,
        "model": {"config_json_path": f"{WORK}/data/config.json"},
        "data": {"text_files": [f"{WORK}/data/corpus.txt"], "eval_every_steps": 4},
        "hyper": {"steps": steps, "batch_size": 2, "seq_len": 32, "lr": {"peak_lr": 0.001}},
        "checkpoints": {"every_steps": 4},
        "output_dir": f"{WORK}/out/{name}",
        "seed": 3,
    }
    s.update(extra)
    return s


def test_installed_with_pip_into_the_venv():
    venv = os.path.realpath(os.environ["MEGATRAIN_VENV"])
    assert os.path.realpath(sys.prefix) == venv
    package = os.path.realpath(os.path.dirname(megatrain.__file__))
    assert package.startswith(venv + os.sep), package
    generated = os.path.join(package, "_proto")
    assert sorted(f for f in os.listdir(generated) if f.endswith("_pb2.py") or
                  f.endswith("_pb2_grpc.py")) == ["megatrain_pb2.py", "megatrain_pb2_grpc.py"]
    assert pb.JobSpec.DESCRIPTOR.full_name == "megatrain.v1.JobSpec"


def test_daemon_status(client):
    status = client.daemon_status()
    assert status.healthy, status.unhealthy_reason
    assert status.version
    assert status.device == "cpu"


def test_submit_watch_status_history_checkpoints(client):
    # A blocker keeps the job QUEUED until the watch is attached, so the watch sees the job
    # from its first step whatever the speed (as tests/server/e2e_test does).
    blocker = client.submit(spec("py-blocker", 100000))
    job = client.submit(spec("py-e2e", 8))
    assert job.id.startswith("job-") and job.state == pb.QUEUED
    events = client.watch(job.id, timeout=WATCH_TIMEOUT)
    first = next(events)
    assert first.job_id == job.id and first.state == pb.QUEUED
    client.cancel(blocker)
    seen = [first] + list(events)  # the iterator ends when the job does
    assert seen[-1].state == pb.SUCCEEDED, seen[-1]
    assert all(e.state not in megatrain.TERMINAL_STATES for e in seen[:-1])
    steps = [e.progress.step for e in seen]
    assert steps == sorted(steps) and steps[-1] == 8 and seen[-1].progress.total_steps == 8
    assert len(seen) >= 2, [megatrain.to_dict(e) for e in seen]

    status = client.status(job.id)
    assert status.state == pb.SUCCEEDED
    assert status.progress.step == 8 and status.spec.hyper.steps == 8
    assert 0 < status.progress.loss < 6
    d = megatrain.to_dict(status)
    assert d["state"] == "SUCCEEDED" and d["progress"]["step"] == 8  # ints, not strings

    history = client.history(job.id)  # ended: returns at once with what the watch saw
    assert [h.step for h in history] == sorted({s for s in steps if s > 0})
    assert history[-1].step == 8 and history[-1].state == "SUCCEEDED"
    assert all(isinstance(h, megatrain.Step) for h in history)
    assert all(math.isfinite(h.loss) and h.loss > 0 for h in history)
    assert history[-1].tokens == 8 * 2 * 32
    # The last step was evaluated (eval_every_steps 4, and always the last).
    assert math.isfinite(history[-1].validation_loss)
    assert history[-1]._asdict()["step"] == 8  # a plain record: json/pandas take it as is
    json.dumps([h._asdict() for h in history])
    # A client that never watched the job sees its last step only.
    with megatrain.Client(socket=SOCKET) as other:
        assert [h.step for h in other.history(job.id, wait=False)] == [8]
        # The daemon's own history has every step (8 < its 512 samples), whoever watched.
        kept = other.daemon_history(job.id)
        assert [k.step for k in kept] == list(range(1, 9))
        assert all(isinstance(k, megatrain.Sample) for k in kept)
        assert all(math.isfinite(k.loss) and k.loss > 0 and k.grad_norm > 0 for k in kept)
        seen = {h.step: h.loss for h in history}  # the watch may have coalesced some steps
        assert all(k.loss == seen[k.step] for k in kept if k.step in seen)
        assert math.isfinite(kept[-1].validation_loss)
        assert [k.unix_ms for k in kept] == sorted(k.unix_ms for k in kept)

    records = client.checkpoints(job.id)
    assert [r.step for r in records] == [4, 8]
    for r in records:
        assert r.job_id == job.id and r.manifest_sha256
        assert os.path.isdir(r.path) and r.path.startswith(f"{WORK}/out/py-e2e"), r.path
    assert client.status(blocker).state == pb.CANCELLED


def test_cancel_a_running_job(client):
    job = client.submit(spec("py-cancel", 100000))
    events = client.watch(job, timeout=WATCH_TIMEOUT)  # a Job works wherever an id does
    for event in events:
        if event.state == pb.RUNNING and event.progress.step >= 1:
            break
    else:
        pytest.fail("the job ended before it ran a step")
    assert client.cancel(job).id == job.id
    rest = list(events)
    assert rest and rest[-1].state == pb.CANCELLED, rest
    assert client.status(job).state == pb.CANCELLED
    assert client.wait(job, timeout=WATCH_TIMEOUT).state == pb.CANCELLED
    steps = client.history(job, wait=False)
    assert steps and steps[-1].step < 100000
    assert [j.id for j in client.jobs(states=["CANCELLED"])].count(job.id) == 1


def until(events, predicate, what):
    """The first event that satisfies predicate (the watch's deadline bounds the wait)."""
    for event in events:
        if predicate(event):
            return event
    pytest.fail(f"the watch ended before {what}")


def test_checkpoint_pause_resume_audit(client):
    job = client.submit(spec("py-pause", 100000))
    events = client.watch(job, timeout=WATCH_TIMEOUT)
    until(events, lambda e: e.state == pb.RUNNING and e.progress.step >= 1, "a step ran")
    record = client.checkpoint(job)
    assert record.job_id == job.id and record.step >= 1 and os.path.isdir(record.path)
    assert record.step in [r.step for r in client.checkpoints(job)]
    assert client.pause(job).id == job.id
    paused = until(events, lambda e: e.state == pb.PAUSED, "PAUSED")
    assert client.status(job).state == pb.PAUSED
    assert client.resume(job).state in (pb.QUEUED, pb.RUNNING)
    until(events, lambda e: e.state == pb.RUNNING and e.progress.step > paused.progress.step,
          "a step after the resume")
    client.cancel(job)
    assert until(events, lambda e: e.state in megatrain.TERMINAL_STATES,
                 "the end").state == pb.CANCELLED
    log = client.audit_log(job)
    assert log.chain_ok, log.problem
    kinds = [entry.kind for entry in log.entries]
    assert kinds[0] == "submit" and {"pause", "resume", "cancel"} <= set(kinds), kinds


def test_daemon_message_fields():
    field_of = megatrain.errors.field_of
    assert field_of("hyper.lr.peak_lr: -1 is outside (0, 10]") == "hyper.lr.peak_lr"
    assert field_of("data.text_files[0]: '/etc' is outside the data roots") == "data.text_files[0]"
    assert field_of("id: job 'job-9' not found") == "id"
    assert field_of("job 'job-9' is not running") is None
    assert field_of("device options: bad") is None
    assert field_of("") is None and field_of(None) is None
    with pytest.raises(megatrain.InvalidArgument) as bad:
        megatrain.job_spec({"model": {"config_json_path": 3}})
    assert bad.value.field == "model.config_json_path"
    with pytest.raises(TypeError):
        megatrain.job_spec(42)


def test_plan_from_dict_jobspec_and_file(client, tmp_path):
    s = spec("py-plan", 8)
    plan = client.plan(s)
    assert plan.parameters > 0
    assert "master" in {p.kind for p in plan.placements}
    assert all(p.bytes > 0 and p.tier for p in plan.placements)
    assert plan.tiers and plan.device_arena_peak_bytes > 0
    assert client.plan(megatrain.job_spec(s)).parameters == plan.parameters
    path = tmp_path / "job.json"
    path.write_text(json.dumps(s))
    assert client.plan(str(path)).parameters == plan.parameters
    # camelCase names are accepted as in spec files.
    camel = dict(s, outputDir=s["output_dir"])
    del camel["output_dir"]
    assert client.plan(camel).parameters == plan.parameters


def test_bad_field_raises_typed_error_naming_it(client):
    bad = spec("py-bad", 8)
    bad["hyper"]["lr"]["peak_lr"] = -1
    with pytest.raises(megatrain.InvalidArgument) as refused:
        client.submit(bad)
    e = refused.value
    assert isinstance(e, megatrain.MegatrainError)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.field == "hyper.lr.peak_lr", e
    assert e.method == "SubmitJob" and e.message.startswith("hyper.lr.peak_lr: ")

    bad = spec("py-bad", 0)
    with pytest.raises(megatrain.InvalidArgument) as refused:
        client.plan(bad)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.field == "hyper.steps"

    # Refused before any call: not a JobSpec.
    bad = spec("py-bad", 8)
    bad["hyper"]["stepz"] = 8
    with pytest.raises(megatrain.InvalidArgument) as refused:
        client.submit(bad)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.field == "hyper.stepz"
    assert not [j for j in client.jobs() if j.spec.name == "py-bad"]


def test_unknown_job_is_not_found(client):
    with pytest.raises(megatrain.NotFound) as missing:
        client.status("job-999999")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.field == "id"
    with pytest.raises(megatrain.NotFound):
        list(client.watch("job-999999", timeout=WATCH_TIMEOUT))
    with pytest.raises(megatrain.NotFound):
        client.daemon_history("job-999999")
    with pytest.raises(megatrain.InvalidArgument) as bad_id:
        client.cancel("no/such/id")
    assert bad_id.value.field == "id"


def test_tcp_with_tls_and_bearer_token():
    address = os.environ["MEGATRAIN_ADDRESS"]
    ca = os.environ["MEGATRAIN_CA_FILE"]
    with megatrain.Client(address=address, token_file=os.environ["MEGATRAIN_TOKEN_FILE"],
                          ca_file=ca, wait_seconds=20) as tcp:
        assert tcp.daemon_status().healthy
    with megatrain.Client(address=address, token="not-the-token-0123456789", ca_file=ca) as wrong:
        with pytest.raises(megatrain.PermissionDenied) as denied:
            wrong.daemon_status()
    assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(ValueError):
        megatrain.Client(address=address, ca_file=ca)  # TCP needs a token


def test_no_daemon_is_unavailable():
    # Beside the daemon's socket: a Unix socket path holds ~108 bytes.
    with megatrain.Client(socket=os.path.join(os.path.dirname(SOCKET), "nowhere.sock")) as nobody:
        with pytest.raises(megatrain.Unavailable) as unreachable:
            nobody.daemon_status()
    assert unreachable.value.code == grpc.StatusCode.UNAVAILABLE
