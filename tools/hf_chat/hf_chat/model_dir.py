"""Loads what an HF model directory says about text: the fast tokenizer (tokenizer.json), the chat
template and special tokens (tokenizer_config.json, special_tokens_map.json, chat_template.jinja)
and the end-of-sequence id (generation_config.json when the tokenizer config names none).

Follows transformers' PreTrainedTokenizerFast loading as far as the chat path needs it: the
template is tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}
from which "default" is taken unless a name is given), else the file chat_template.jinja; the
special-token variables handed to the template are the special-token attributes that are set,
as strings; added tokens listed in tokenizer_config.json's added_tokens_decoder that the
tokenizer.json lacks are added to it, as transformers does when it loads the directory.

A caller that checked the files itself (megatraind) passes them as inherited descriptors, one per
file name (`held`): then only those are read, never a path, and a name not held counts as absent.
"""

import json
import os
from dataclasses import dataclass, field

from tokenizers import AddedToken, Tokenizer

from .errors import ModelError

# transformers' SPECIAL_TOKENS_ATTRIBUTES, in its order.
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token", "additional_special_tokens")


@dataclass
class ModelText:
    tokenizer: Tokenizer
    chat_template: str  # None: the directory has none (prompt + completion + eos)
    special_tokens: dict  # bos_token etc. -> str; additional_special_tokens -> [str]
    eos_id: int  # None when neither the tokenizer config nor generation_config names one
    bos_id: int  # the BOS to prepend without a template (add_bos_token), else None
    special_ids: set = field(default_factory=set)  # ids of added tokens marked special


class _Files:
    """The directory's files by name: opened by path, or read from held descriptors."""

    def __init__(self, directory, held):
        self.directory = directory
        self.held = held  # None, or {file name: inherited descriptor}

    def path(self, name):
        return os.path.join(self.directory, name)

    def exists(self, name):
        return name in self.held if self.held is not None else os.path.exists(self.path(name))

    def read_text(self, name):
        if self.held is None:
            with open(self.path(name), encoding="utf-8") as f:
                return f.read()
        fd, chunks, offset = self.held[name], [], 0
        while True:  # pread: the holder's file offset is left alone
            chunk = os.pread(fd, 1 << 20, offset)
            if not chunk:
                return b"".join(chunks).decode("utf-8")
            chunks.append(chunk)
            offset += len(chunk)


def _read_json(files, name, required):
    path = files.path(name)
    if not files.exists(name):
        if required:
            raise ModelError(f"{path}: missing")
        return {}
    try:
        value = json.loads(files.read_text(name))
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: {e}") from None
    if not isinstance(value, dict):
        raise ModelError(f"{path}: not a JSON object")
    return value


def _token_text(value, where):
    """A special token as tokenizer_config stores it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str):
        raise ModelError(f"{where}: not a token string or {{\"content\": ...}}")
    return value


def _pick_template(config, files, name):
    where = files.path("tokenizer_config.json")
    template = config.get("chat_template")
    if template is None and files.exists("chat_template.jinja"):
        try:
            template = files.read_text("chat_template.jinja")
        except (OSError, ValueError) as e:
            raise ModelError(f"{files.path('chat_template.jinja')}: {e}") from None
    if isinstance(template, list):
        named = {}
        for i, entry in enumerate(template):
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise ModelError(f"{where}: field chat_template[{i}]: not "
                                 "{\"name\": str, \"template\": str}")
            named[entry["name"]] = entry["template"]
        key = name or "default"
        if key not in named:
            raise ModelError(f"{where}: field chat_template: no template named {key!r} "
                             f"(names: {', '.join(sorted(named))}); pick one with --template_name")
        return named[key]
    if name is not None:
        raise ModelError(f"{where}: field chat_template: a single template, so "
                         f"--template_name={name} names nothing")
    if template is not None and not isinstance(template, str):
        raise ModelError(f"{where}: field chat_template: neither a string nor a list")
    return template


def load(directory, template_name=None, held=None):
    """Reads the directory (or its `held` descriptors, {file name: fd}); raises ModelError naming
    the file and field at fault."""
    files = _Files(directory, held)
    if held is None and not os.path.isdir(directory):
        raise ModelError(f"{directory}: not a directory")
    tokenizer_path = files.path("tokenizer.json")
    if not files.exists("tokenizer.json"):
        raise ModelError(f"{tokenizer_path}: missing (only fast HF tokenizers are supported)")
    try:
        tokenizer = Tokenizer.from_str(files.read_text("tokenizer.json"))
    except Exception as e:  # tokenizers raises its own Exception subclass
        raise ModelError(f"{tokenizer_path}: {e}") from None
    config_path = files.path("tokenizer_config.json")
    config = _read_json(files, "tokenizer_config.json", required=False)
    legacy = _read_json(files, "special_tokens_map.json", required=False)

    # Added tokens the config knows and tokenizer.json lacks (transformers adds them on load).
    decoder = config.get("added_tokens_decoder", {})
    if not isinstance(decoder, dict):
        raise ModelError(f"{config_path}: field added_tokens_decoder: not an object")
    for index, token in sorted(decoder.items(), key=lambda kv: int(kv[0])):
        content = _token_text(token, f"{config_path}: field added_tokens_decoder.{index}")
        if tokenizer.token_to_id(content) is None:
            special = bool(token.get("special")) if isinstance(token, dict) else False
            added = AddedToken(content, special=special,
                               normalized=bool(token.get("normalized", not special))
                               if isinstance(token, dict) else True)
            (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([added])

    special = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key, legacy.get(key))
        if value is None:
            continue
        if key == "additional_special_tokens":
            if not isinstance(value, list):
                raise ModelError(f"{config_path}: field {key}: not a list")
            value = [_token_text(v, f"{config_path}: field {key}") for v in value]
        else:
            value = _token_text(value, f"{config_path}: field {key}")
        if value:  # transformers hands only the attributes that are set (truthy)
            special[key] = value

    special_ids = {tid for tid, tok in tokenizer.get_added_tokens_decoder().items()
                   if tok.special}
    eos_id = None
    if "eos_token" in special:
        eos_id = tokenizer.token_to_id(special["eos_token"])
        if eos_id is None:
            raise ModelError(f"{config_path}: field eos_token: {special['eos_token']!r} is not in "
                             "the tokenizer's vocabulary")
    else:
        generation = _read_json(files, "generation_config.json", False)
        value = generation.get("eos_token_id")
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            eos_id = value
    bos_id = None
    if config.get("add_bos_token") is True and "bos_token" in special:
        bos_id = tokenizer.token_to_id(special["bos_token"])
    return ModelText(tokenizer, _pick_template(config, files, template_name), special,
                     eos_id, bos_id, special_ids)
