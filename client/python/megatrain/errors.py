"""Typed errors of the megatrain client: each carries the gRPC code and the field it names.

megatraind names the offending field at the start of its status message
("hyper.lr.peak_lr: -1 is outside (0, 10]", "id: job 'job-9' not found"); the
error keeps the whole message and the field apart. A spec dict that is not a
JobSpec fails before any call, as InvalidArgument naming the field too.
"""
import re

import grpc

# "field: problem", where field is a proto path such as data.text_files[0] or memory.nvme_bytes.
_FIELD = re.compile(r"^([A-Za-z_]\w*(?:\[\d+\])?(?:\.[A-Za-z_]\w*(?:\[\d+\])?)*): ")


def field_of(message):
    """The field a daemon message names at its start, or None."""
    match = _FIELD.match(message or "")
    return match.group(1) if match else None


class MegatrainError(Exception):
    """A refused or failed call: `.code` (grpc.StatusCode), `.field` (str or None),
    `.message` (the daemon's text), `.method` (the RPC, e.g. "SubmitJob")."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None, field=None, method=None):
        self.message = message
        if code is not None:
            self.code = code
        self.field = field
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{self.code.name}: {message}")


class InvalidArgument(MegatrainError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MegatrainError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(MegatrainError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(MegatrainError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(MegatrainError):
    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(MegatrainError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(MegatrainError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unimplemented(MegatrainError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Unavailable(MegatrainError):
    """No daemon answered (not started, wrong socket or address, shutting down)."""
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(MegatrainError):
    """No answer within the deadline; the request may still complete."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(MegatrainError):
    code = grpc.StatusCode.CANCELLED


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotFound, AlreadyExists, PermissionDenied, Unauthenticated,
    ResourceExhausted, FailedPrecondition, Unimplemented, Unavailable, DeadlineExceeded,
    Cancelled)}


def from_rpc_error(error, method=None):
    """The typed error for a grpc.RpcError (a grpc.Call: it has code() and details())."""
    code = error.code()
    message = error.details() or ""
    cls = _BY_CODE.get(code, MegatrainError)
    return cls(message, code=code, field=field_of(message), method=method)


def from_parse_error(error):
    """InvalidArgument for a json_format.ParseError of a spec dict, naming the field path."""
    text = str(error)
    path = re.findall(r"Failed to parse (\w+) field", text)
    unknown = re.search(r'has no field named "(\w+)"', text)
    if unknown:
        path.append(unknown.group(1))
    field = ".".join(path) or None
    return InvalidArgument(f"{field or 'spec'}: not a JobSpec: {text.splitlines()[0]}",
                           field=field, method="JobSpec")
