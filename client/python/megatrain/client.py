"""Client: megatraind's Trainer service from Python, connected as the `megatrain` CLI connects.

Unix socket: plain gRPC on unix:<path> (the daemon knows the caller from the socket).
TCP: TLS, plus the bearer token as call credentials, i.e. the metadata
"authorization: Bearer <token>" on every call (what the CLI's --token_file sends);
the token is stripped of surrounding whitespace as the CLI and the daemon strip it.
Calls return the generated protobuf messages (megatrain.pb); refusals raise the
typed errors of megatrain.errors.
"""
import math
import os
import threading
from typing import Iterator, List, NamedTuple, Optional

import grpc
from google.protobuf import json_format

from . import errors
from ._proto import megatrain_pb2 as pb
from ._proto import megatrain_pb2_grpc as pb_grpc

DEFAULT_SOCKET = "/run/megatrain/megatraind.sock"
TERMINAL_STATES = frozenset({pb.SUCCEEDED, pb.FAILED, pb.CANCELLED})

# Unary deadlines as the CLI sets them (client/command_deadline.cc): 30 s, a checkpoint
# 150 s (the daemon waits up to 120 s for the commit), resume 120 s (it re-hashes data).
DEFAULT_TIMEOUT = 30.0
CHECKPOINT_TIMEOUT = 150.0
RESUME_TIMEOUT = 120.0


class Step(NamedTuple):
    """One optimizer step as the job's progress reported it (a row of history())."""
    step: int
    total_steps: int
    tokens: int
    loss: float
    validation_loss: float  # NaN until the first evaluation
    learning_rate: float
    tokens_per_second: float
    state: str              # the job's state when the step was reported, e.g. "RUNNING"
    unix_ms: int


class Sample(NamedTuple):
    """One step the daemon kept in its bounded history of the job (a row of daemon_history())."""
    step: int
    unix_ms: int
    loss: float
    learning_rate: float
    grad_norm: float        # before clipping
    tokens_per_second: float
    skipped: bool           # non-finite gradient norm: no update
    validation_loss: float  # the latest evaluation at or before this step; NaN before the first


def job_spec(spec):
    """A JobSpec from a JobSpec, a dict of the spec-file JSON shape (snake_case or camelCase,
    unknown fields refused, as `megatrain submit --spec` reads it) or a JSON file's path."""
    if isinstance(spec, pb.JobSpec):
        return spec
    try:
        if isinstance(spec, (str, os.PathLike)):
            with open(spec) as f:
                return json_format.Parse(f.read(), pb.JobSpec())
        if isinstance(spec, dict):
            return json_format.ParseDict(spec, pb.JobSpec())
    except json_format.ParseError as e:
        raise errors.from_parse_error(e) from None
    raise TypeError(f"spec: expected a dict, a megatrain.pb.JobSpec or a path, not "
                    f"{type(spec).__name__}")


def to_dict(message):
    """A message as a dict with the proto's field names (enums by name, 64-bit ints as ints)."""
    d = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return _ints(d, message.DESCRIPTOR)


def _ints(value, descriptor):
    # MessageToDict writes 64-bit integers as strings (proto3 JSON); a Python caller wants ints.
    from google.protobuf.descriptor import FieldDescriptor as F
    wide = {F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64}
    for name, v in list(value.items()):
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None:
            if isinstance(v, list):
                value[name] = [_ints(x, field.message_type) for x in v]
            elif isinstance(v, dict):
                value[name] = _ints(v, field.message_type)
        elif field.type in wide:
            value[name] = [int(x) for x in v] if isinstance(v, list) else int(v)
    return value


def _job_id(job):
    return job if isinstance(job, str) else job.id


class Client:
    """A connection to one megatraind.

    Client(socket="/run/megatrain/megatraind.sock")            # the default
    Client(address="host:7070", token="...", ca_file="ca.pem")  # TCP: TLS + bearer token

    token_file may stand for token; ca_file (or root_certificates, PEM bytes) names the CA
    that signed the daemon's certificate (default: the system roots). wait_seconds > 0 waits
    that long for the daemon to accept connections (Unavailable otherwise). timeout is the
    deadline of unary calls in seconds.
    """

    def __init__(self, socket=None, address=None, token=None, token_file=None, ca_file=None,
                 root_certificates=None, timeout=DEFAULT_TIMEOUT, wait_seconds=0,
                 options=None):
        if socket and address:
            raise ValueError("Client: give socket or address, not both")
        if token and token_file:
            raise ValueError("Client: give token or token_file, not both")
        if address:
            if token_file:
                with open(token_file) as f:
                    token = f.read()
            token = (token or "").strip()
            if not token:
                raise ValueError("Client: address needs a token (TCP needs a bearer token)")
            if ca_file:
                with open(ca_file, "rb") as f:
                    root_certificates = f.read()
            credentials = grpc.composite_channel_credentials(
                grpc.ssl_channel_credentials(root_certificates=root_certificates),
                grpc.access_token_call_credentials(token))
            self._channel = grpc.secure_channel(address, credentials, options=options)
            self.target = address
        else:
            if token or token_file:
                raise ValueError("Client: a token goes with address (TCP); the Unix socket "
                                 "takes none")
            self.target = "unix:" + (socket or DEFAULT_SOCKET)
            self._channel = grpc.insecure_channel(self.target, options=options)
        self._stub = pb_grpc.TrainerStub(self._channel)
        self.timeout = timeout
        self._seen = {}  # job id -> {step: Step}, from the events this client received
        self._lock = threading.Lock()
        if wait_seconds > 0:
            try:
                grpc.channel_ready_future(self._channel).result(timeout=wait_seconds)
            except grpc.FutureTimeoutError:
                self.close()
                raise errors.Unavailable(
                    f"daemon not reachable at {self.target} within {wait_seconds} s") from None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, method) from None

    # Jobs.
    def submit(self, spec) -> pb.Job:
        """Queues a job; spec: dict (spec-file JSON shape), JobSpec or JSON file path."""
        return self._call("SubmitJob", pb.SubmitJobRequest(spec=job_spec(spec)))

    def status(self, job) -> pb.Job:
        return self._call("GetJob", pb.GetJobRequest(id=_job_id(job)))

    def jobs(self, states=()) -> List[pb.Job]:
        """Every job, oldest first (all pages); states: JobState values or names to keep."""
        request = pb.ListJobsRequest(
            states=[pb.JobState.Value(s) if isinstance(s, str) else s for s in states])
        result = []
        while True:
            page = self._call("ListJobs", request)
            result.extend(page.jobs)
            if not page.next_page_token:
                return result
            request.page_token = page.next_page_token

    def cancel(self, job) -> pb.Job:
        return self._call("CancelJob", pb.JobRef(id=_job_id(job)))

    def pause(self, job) -> pb.Job:
        return self._call("PauseJob", pb.JobRef(id=_job_id(job)))

    def resume(self, job, allow_data_change=False) -> pb.Job:
        return self._call("ResumeJob",
                          pb.ResumeJobRequest(id=_job_id(job),
                                              allow_data_change=allow_data_change),
                          timeout=max(self.timeout, RESUME_TIMEOUT))

    def checkpoint(self, job) -> pb.CheckpointRecord:
        """Checkpoints a running job now and returns the record (waits for the commit)."""
        return self._call("Checkpoint", pb.JobRef(id=_job_id(job)),
                          timeout=max(self.timeout, CHECKPOINT_TIMEOUT))

    def checkpoints(self, job) -> List[pb.CheckpointRecord]:
        return list(self._call("ListCheckpoints", pb.JobRef(id=_job_id(job))).checkpoints)

    def daemon_history(self, job) -> List[Sample]:
        """The job's steps as the daemon kept them since it started the job in this daemon
        run, whoever watched: at most a fixed number (512) of samples, evenly thinned when
        the run is longer (every 2nd, 4th, ... step; the newest is always last), in memory
        only (a restarted daemon starts afresh). Each carries the latest validation loss."""
        h = self._call("GetJobHistory", pb.JobRef(id=_job_id(job)))
        validation = sorted((v.step, v.validation_loss) for v in h.validation)
        out, i, current = [], 0, math.nan
        for s in h.steps:
            while i < len(validation) and validation[i][0] <= s.step:
                current = validation[i][1]
                i += 1
            out.append(Sample(step=s.step, unix_ms=s.unix_ms, loss=s.loss,
                              learning_rate=s.learning_rate, grad_norm=s.grad_norm,
                              tokens_per_second=s.tokens_per_second, skipped=s.skipped,
                              validation_loss=current))
        return out

    def plan(self, spec) -> pb.PlanResponse:
        """Placement and predicted bytes per tier of a spec, without running it."""
        return self._call("Plan", job_spec(spec))

    def daemon_status(self) -> pb.DaemonStatus:
        return self._call("GetDaemonStatus", pb.GetDaemonStatusRequest())

    def audit_log(self, job) -> pb.AuditLog:
        return self._call("GetAuditLog", pb.GetAuditLogRequest(job_id=_job_id(job)))

    # Progress.
    def watch(self, job, timeout=None) -> Iterator[pb.ProgressEvent]:
        """The job's progress events until it ends (SUCCEEDED, FAILED or CANCELLED): the
        iterator then stops. The daemon sends the job's state when the watch starts, then each
        change; steps that pass between two sends are not repeated (the latest progress is).
        timeout bounds the whole watch in seconds (DeadlineExceeded); None = unbounded.
        Leaving the loop early cancels the stream."""
        job_id = _job_id(job)
        call = self._stub.WatchJob(pb.WatchJobRequest(id=job_id), timeout=timeout)
        try:
            for event in call:
                self._record(event)
                yield event
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, "WatchJob") from None
        finally:
            call.cancel()  # a no-op once the stream has ended

    def wait(self, job, timeout=None) -> pb.Job:
        """Watches the job until it ends and returns it (its final state and progress)."""
        for _ in self.watch(job, timeout=timeout):
            pass
        return self.status(job)

    def history(self, job, wait=True, timeout=None) -> List[Step]:
        """The job's steps as this client saw them, one Step per step, in order (no pandas:
        `pandas.DataFrame(history)` works if you want one). wait=True first watches the job
        until it ends (bounded by timeout); wait=False adds only its current progress.
        Steps come from the progress events this client received, so watch a job from its
        start (watch, wait or history) to see every step it reported (daemon_history() has
        the daemon's own bounded record of every step, whoever watched); a job first looked
        at after it ended has its last step only. A PAUSED job has not ended: wait=True
        waits until it is resumed and ends (use wait=False)."""
        job_id = _job_id(job)
        if wait:
            for _ in self.watch(job_id, timeout=timeout):
                pass
        else:
            current = self.status(job_id)
            self._record(pb.ProgressEvent(job_id=job_id, state=current.state,
                                          progress=current.progress))
        with self._lock:
            seen = self._seen.get(job_id, {})
            return [seen[s] for s in sorted(seen)]

    def _record(self, event):
        p = event.progress
        if p.step == 0:
            return
        step = Step(step=p.step, total_steps=p.total_steps, tokens=p.tokens, loss=p.loss,
                    validation_loss=p.validation_loss, learning_rate=p.learning_rate,
                    tokens_per_second=p.tokens_per_second,
                    state=pb.JobState.Name(event.state), unix_ms=event.unix_ms)
        with self._lock:
            steps = self._seen.setdefault(event.job_id, {})
            old = steps.get(p.step)
            # A later report of the same step may add its validation loss: keep the fullest.
            if old is not None and math.isnan(step.validation_loss):
                step = step._replace(validation_loss=old.validation_loss)
            steps[p.step] = step
