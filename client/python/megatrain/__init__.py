"""megatrain: the Python client of megatraind (docs/python.md).

    import megatrain
    client = megatrain.Client(socket="/run/megatrain/megatraind.sock")
    job = client.submit({"model": {"config_json_path": "builtin:tiny"}, ...})
    for event in client.watch(job.id): ...

megatrain.pb is the generated protobuf module (JobSpec, Job, JobState values such as
megatrain.pb.SUCCEEDED, ...); errors are in megatrain.errors and exported here.
"""
from ._proto import megatrain_pb2 as pb
from .client import (CHECKPOINT_TIMEOUT, DEFAULT_SOCKET, DEFAULT_TIMEOUT, TERMINAL_STATES, Client,
                     Sample, Step, job_spec, to_dict)
from .errors import (AlreadyExists, Cancelled, DeadlineExceeded, FailedPrecondition,
                     InvalidArgument, MegatrainError, NotFound, PermissionDenied,
                     ResourceExhausted, Unauthenticated, Unavailable, Unimplemented)

__all__ = [
    "pb", "Client", "Sample", "Step", "job_spec", "to_dict", "DEFAULT_SOCKET", "DEFAULT_TIMEOUT",
    "CHECKPOINT_TIMEOUT", "TERMINAL_STATES", "MegatrainError", "InvalidArgument", "NotFound",
    "AlreadyExists", "PermissionDenied", "Unauthenticated", "ResourceExhausted",
    "FailedPrecondition", "Unimplemented", "Unavailable", "DeadlineExceeded", "Cancelled",
]
