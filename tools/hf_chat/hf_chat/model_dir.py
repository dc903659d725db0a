"""Loads what an HF model directory says about text: the fast tokenizer (tokenizer.json), the chat
template and special tokens (tokenizer_config.json, special_tokens_map.json, chat_template.jinja)
and the end-of-sequence id (generation_config.json when the tokenizer config names none).

Follows transformers' PreTrainedTokenizerFast loading as far as the chat path needs it: the
template is chat_template.jinja (with additional_chat_templates/NAME.jinja), else
tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}); of
several, "default" is taken unless a name is given. The special-token variables handed to the
template are the special-token attributes that are set, as strings. The tokenizer is adjusted as
PreTrainedTokenizerFast adjusts it (split_special_tokens; added and special tokens the config
names; add_prefix_space); what a model-specific tokenizer class does besides (LlamaTokenizerFast
rebuilding from a slow tokenizer, say) is not repeated: tokenizer.json is taken as it is.

A caller that checked the files itself (megatraind) passes the top-level files as inherited
descriptors, one per file name (`held`): then only those are read, never a path; a name not held
counts as absent (additional_chat_templates/ included).
"""

import json
import os
from dataclasses import dataclass, field

from tokenizers import AddedToken, Tokenizer, pre_tokenizers

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


class Files:
    """The directory's files by name: opened by path, or read from held descriptors."""

    def __init__(self, directory, held):
        self.directory = directory
        self.held = held  # None, or {file name: inherited descriptor}

    def path(self, name):
        return os.path.join(self.directory, name)

    def exists(self, name):
        return name in self.held if self.held is not None else os.path.isfile(self.path(name))

    def read_text(self, name):
        try:
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
        except (OSError, ValueError) as e:
            raise ModelError(f"{self.path(name)}: {e}") from None


def _read_json(files, name, required):
    path = files.path(name)
    if not files.exists(name):
        if required:
            raise ModelError(f"{path}: missing")
        return {}
    try:
        value = json.loads(files.read_text(name))
    except ValueError as e:
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


def _special_value(source, key, where):
    value = source.get(key)
    if value is None:
        return None
    if key == "additional_special_tokens":
        if not isinstance(value, list):
            raise ModelError(f"{where}: field {key}: not a list")
        return [_token_text(v, f"{where}: field {key}") for v in value]
    return _token_text(value, f"{where}: field {key}")


def _templates(config, files):
    """The directory's templates: a string, a {name: template} dict, or None.

    As transformers 4.55 loads them: chat_template.jinja (named "default") and
    additional_chat_templates/NAME.jinja take priority over tokenizer_config.json's entry.
    """
    where = files.path("tokenizer_config.json")
    found = {}
    if files.exists("chat_template.jinja"):
        found["default"] = files.read_text("chat_template.jinja")
    extra_dir = files.path("additional_chat_templates")
    if files.held is None and os.path.isdir(extra_dir):
        for name in sorted(os.listdir(extra_dir)):
            if name.endswith(".jinja"):
                found[name[: -len(".jinja")]] = files.read_text(
                    os.path.join("additional_chat_templates", name))
    if found:
        return found["default"] if list(found) == ["default"] else found
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {}
        for i, entry in enumerate(template):
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise ModelError(f"{where}: field chat_template[{i}]: not "
                                 "{\"name\": str, \"template\": str}")
            named[entry["name"]] = entry["template"]
        return named
    if template is not None and not isinstance(template, str):
        raise ModelError(f"{where}: field chat_template: neither a string nor a list")
    return template


def _pick_template(config, files, name):
    directory = files.directory
    templates = _templates(config, files)
    if isinstance(templates, dict):
        key = name or "default"
        if key not in templates:
            raise ModelError(f"{directory}: no chat template named {key!r} (names: "
                             f"{', '.join(sorted(templates))}); pick one with --template_name")
        return templates[key]
    if name is not None:
        raise ModelError(f"{directory}: a single chat template, so --template_name={name} names "
                         "nothing")
    return templates


def _adjust_like_transformers(tokenizer, config, config_path, special):
    """What PreTrainedTokenizerFast does to the tokenizer.json it loads (generic class only)."""
    # split_special_tokens: special tokens written in the text are then not matched as tokens.
    tokenizer.encode_special_tokens = bool(config.get("split_special_tokens", False))

    # Added tokens the config lists and the tokenizer lacks, then special tokens that are not
    # added tokens yet (even when the model's vocabulary has them: they then match as a whole).
    decoder = config.get("added_tokens_decoder", {})
    if not isinstance(decoder, dict):
        raise ModelError(f"{config_path}: field added_tokens_decoder: not an object")
    present = {tok.content for tok in tokenizer.get_added_tokens_decoder().values()}
    ordered_special = []  # transformers' all_special_tokens order
    for key in SPECIAL_TOKEN_KEYS:
        values = special.get(key, [])
        for value in values if isinstance(values, list) else [values]:
            if value not in ordered_special:
                ordered_special.append(value)
    named_special = set(ordered_special)
    to_add = []
    for index, token in sorted(decoder.items(), key=lambda kv: int(kv[0])):
        content = _token_text(token, f"{config_path}: field added_tokens_decoder.{index}")
        if content in present:
            continue
        flags = {k: token[k] for k in ("single_word", "lstrip", "rstrip", "normalized")
                 if isinstance(token, dict) and k in token}
        is_special = bool(token.get("special")) if isinstance(token, dict) else False
        to_add.append(AddedToken(content, special=is_special or content in named_special,
                                 **flags))
        present.add(content)
    for content in ordered_special:
        if content not in present:
            to_add.append(AddedToken(content, special=True))
    if to_add:
        tokenizer.add_tokens(to_add)

    # add_prefix_space from the config (default false) replaces a top-level pre-tokenizer's.
    wanted = bool(config.get("add_prefix_space", False))
    try:
        state = json.loads(tokenizer.pre_tokenizer.__getstate__())
    except Exception:  # no pre-tokenizer, or one that does not serialize: nothing to adjust
        return
    if state.get("add_prefix_space", wanted) != wanted:
        kind = state.pop("type")
        state["add_prefix_space"] = wanted
        tokenizer.pre_tokenizer = getattr(pre_tokenizers, kind)(**state)


def load(directory, template_name=None, held=None):
    """Reads the directory (or its `held` descriptors, {file name: fd}); raises ModelError naming
    the file and field at fault."""
    files = Files(directory, held)
    if held is None and not os.path.isdir(directory):
        raise ModelError(f"{directory}: not a directory")
    tokenizer_path = files.path("tokenizer.json")
    if not files.exists("tokenizer.json"):
        raise ModelError(f"{tokenizer_path}: missing (only fast HF tokenizers are supported)")
    tokenizer_text = files.read_text("tokenizer.json")
    try:
        tokenizer = Tokenizer.from_str(tokenizer_text)
    except Exception as e:  # tokenizers raises its own Exception subclass
        raise ModelError(f"{tokenizer_path}: {e}") from None
    # transformers encodes with truncation and padding off unless asked (apply_chat_template
    # asks for neither): settings saved in tokenizer.json must not cut or pad a sample.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    config_path = files.path("tokenizer_config.json")
    config = _read_json(files, "tokenizer_config.json", required=False)
    legacy_path = files.path("special_tokens_map.json")
    legacy = _read_json(files, "special_tokens_map.json", required=False)

    special = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = _special_value(config, key, config_path)
        if "added_tokens_decoder" not in config and key in legacy:
            # transformers reads special_tokens_map.json only for a config without
            # added_tokens_decoder, and then its entries win (lists are merged).
            extra = _special_value(legacy, key, legacy_path)
            if key == "additional_special_tokens":
                value = (value or []) + [t for t in extra or [] if t not in (value or [])]
            elif extra is not None:
                value = extra
        if value:  # transformers hands only the attributes that are set (truthy)
            special[key] = value

    _adjust_like_transformers(tokenizer, config, config_path, special)
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
    if "bos_token" in special:
        candidate = tokenizer.token_to_id(special["bos_token"])
        if config.get("add_bos_token") is True:
            bos_id = candidate
        elif "add_bos_token" not in config and candidate is not None:
            # No word in the config (Llama 3's base models): transformers then adds what
            # tokenizer.json's post-processor adds, so a BOS it puts first is the model's.
            with_special = tokenizer.encode("a", add_special_tokens=True).ids
            plain = tokenizer.encode("a", add_special_tokens=False).ids
            if with_special[:1] == [candidate] and plain[:1] != [candidate]:
                bos_id = candidate
    return ModelText(tokenizer, _pick_template(config, files, template_name), special,
                     eos_id, bos_id, special_ids)
