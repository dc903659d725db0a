"""Reads JSONL training files line by line and turns each line into a validated conversation.

Three formats, detected per line from its keys (or forced with --format); one file holds one:
  chat:              {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
  prompt_completion: {"prompt": str, "completion": str}
  alpaca:            {"instruction": str, "input": str (optional), "output": str}
Prompt/completion and Alpaca become [user, assistant]; Alpaca's user turn is the instruction,
then a blank line and the input when the input is non-empty. Other top-level keys are ignored
(datasets carry ids and sources); keys inside a message other than role/content are refused,
since a template could render them and this tool does not check what they mean.
"""

import json
import os
from dataclasses import dataclass

from .errors import InputError

FORMATS = ("chat", "prompt_completion", "alpaca")
ROLES = ("system", "user", "assistant")
_FORMAT_KEYS = {
    "chat": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "output"),
}


@dataclass(frozen=True)
class Limits:
    """Caps that keep one line from exhausting memory or the template engine."""

    max_line_bytes: int = 8 << 20
    max_messages: int = 1024


@dataclass
class Sample:
    """One validated line: the conversation and, for the two single-turn formats, its parts."""

    path: str
    line: int
    format: str
    messages: list  # [{"role": ..., "content": ...}]
    prompt: str = None  # the user turn's text (single-turn formats)
    completion: str = None  # the assistant turn's text (single-turn formats)


def _reject_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {json.dumps(key, ensure_ascii=False)}")
        seen[key] = value
    return seen


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def _short(value, limit=60):
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def detect_format(obj):
    """The format whose keys the object has; None when it has none or several."""
    found = [name for name, keys in _FORMAT_KEYS.items() if any(k in obj for k in keys)]
    return found[0] if len(found) == 1 else None


def _text(obj, key, path, line, field, required=True, non_empty=False):
    if key not in obj:
        if required:
            raise InputError(path, line, field, "missing")
        return ""
    value = obj[key]
    if not isinstance(value, str):
        raise InputError(path, line, field, f"must be a string, not {_short(value)}")
    if non_empty and not value.strip():
        raise InputError(path, line, field, "must not be empty")
    return value


def _chat(obj, path, line, limits):
    messages = obj["messages"]
    if not isinstance(messages, list):
        raise InputError(path, line, "messages", f"must be a list, not {_short(messages)}")
    if not messages:
        raise InputError(path, line, "messages", "must not be empty")
    if len(messages) > limits.max_messages:
        raise InputError(path, line, "messages",
                         f"{len(messages)} messages exceed the cap of {limits.max_messages}")
    out = []
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InputError(path, line, field, f"must be an object, not {_short(message)}")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise InputError(path, line, f"{field}.{extra[0]}",
                             "unsupported (a message has only role and content)")
        role = message.get("role")
        if role not in ROLES:
            raise InputError(path, line, f"{field}.role",
                             f"must be one of system, user, assistant, not {_short(role)}")
        if role == "system" and i != 0:
            raise InputError(path, line, f"{field}.role", "a system message must come first")
        content = _text(message, "content", path, line, f"{field}.content",
                        non_empty=(role == "assistant"))
        out.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in out):
        raise InputError(path, line, "messages", "no assistant message: nothing to learn from")
    return Sample(path, line, "chat", out)


def _single_turn(fmt, obj, path, line):
    if fmt == "prompt_completion":
        prompt = _text(obj, "prompt", path, line, "prompt")
        completion = _text(obj, "completion", path, line, "completion", non_empty=True)
    else:
        instruction = _text(obj, "instruction", path, line, "instruction", non_empty=True)
        extra = _text(obj, "input", path, line, "input", required=False)
        completion = _text(obj, "output", path, line, "output", non_empty=True)
        prompt = instruction + ("\n\n" + extra if extra else "")
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    return Sample(path, line, fmt, messages, prompt, completion)


def parse_line(raw, path, line, forced_format=None, limits=Limits()):
    """One JSONL line (bytes, without its newline) -> Sample; raises InputError."""
    if len(raw) > limits.max_line_bytes:
        raise InputError(path, line, None,
                         f"line of {len(raw)} bytes exceeds the cap of {limits.max_line_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, line, None, f"not UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_reject_duplicates,
                         parse_constant=_reject_constant)
    except ValueError as e:
        raise InputError(path, line, None, f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise InputError(path, line, None, f"must be a JSON object, not {_short(obj)}")
    fmt = forced_format or detect_format(obj)
    if fmt is None:
        keys = [k for ks in _FORMAT_KEYS.values() for k in ks if k in obj]
        if keys:
            raise InputError(path, line, keys[0],
                             f"keys of several formats ({', '.join(keys)}): which one is meant?")
        raise InputError(path, line, None, "no messages, prompt/completion or "
                         "instruction/output: not a chat, prompt_completion or alpaca line")
    if fmt == "chat":
        if "messages" not in obj:
            raise InputError(path, line, "messages", "missing (--format=chat)")
        return _chat(obj, path, line, limits)
    return _single_turn(fmt, obj, path, line)


def read_samples(path, forced_format=None, limits=Limits(), fd=None):
    """Yields (Sample or InputError) for each non-blank line of one file, streaming.

    With `fd` (an inherited descriptor of the file a caller checked) the file is read from it,
    from its start, and `path` only names it in errors.

    A file's first sample fixes its format; a later line of another format is an error (mixed
    files are refused, so a typo in one key cannot silently change how a line is rendered).
    """
    file_format = None
    first_line = None
    if fd is not None:
        os.lseek(fd, 0, os.SEEK_SET)
    with (open(os.dup(fd), "rb") if fd is not None else open(path, "rb")) as f:
        number = 0
        while True:
            # readline with a bound: an overlong line is refused without holding it whole.
            raw = f.readline(limits.max_line_bytes + 1)
            if not raw:
                return
            number += 1
            if len(raw) > limits.max_line_bytes and not raw.endswith(b"\n"):
                size = len(raw)
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(1 << 20)
                    size += len(raw)
                size -= len(raw) - len(raw.rstrip(b"\r\n"))  # the line without its end
                yield InputError(path, number, None, f"line of {size} bytes exceeds the cap "
                                 f"of {limits.max_line_bytes}")
                continue
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue
            try:
                sample = parse_line(raw, path, number, forced_format, limits)
                if file_format is None:
                    file_format, first_line = sample.format, number
                elif sample.format != file_format:
                    article = "an" if sample.format == "alpaca" else "a"
                    raise InputError(path, number, None,
                                     f"{article} {sample.format} line in a {file_format} file "
                                     f"(line {first_line}); one file holds one format")
                yield sample
            except InputError as e:
                yield e
