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


def _read_json(path, required):
    if not os.path.exists(path):
        if required:
            raise ModelError(f"{path}: missing")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
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


def _special_value(source, key, where):
    value = source.get(key)
    if value is None:
        return None
    if key == "additional_special_tokens":
        if not isinstance(value, list):
            raise ModelError(f"{where}: field {key}: not a list")
        return [_token_text(v, f"{where}: field {key}") for v in value]
    return _token_text(value, f"{where}: field {key}")


def _read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: {e}") from None


def _templates(config, directory):
    """The directory's templates: a string, a {name: template} dict, or None.

    As transformers 4.55 loads them: chat_template.jinja (named "default") and
    additional_chat_templates/NAME.jinja take priority over tokenizer_config.json's entry.
    """
    where = os.path.join(directory, "tokenizer_config.json")
    files = {}
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja):
        files["default"] = _read_text(jinja)
    extra_dir = os.path.join(directory, "additional_chat_templates")
    if os.path.isdir(extra_dir):
        for name in sorted(os.listdir(extra_dir)):
            if name.endswith(".jinja"):
                files[name[: -len(".jinja")]] = _read_text(os.path.join(extra_dir, name))
    if files:
        return files["default"] if list(files) == ["default"] else files
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


def _pick_template(config, directory, name):
    templates = _templates(config, directory)
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


def load(directory, template_name=None):
    """Reads the directory; raises ModelError naming the file and field at fault."""
    if not os.path.isdir(directory):
        raise ModelError(f"{directory}: not a directory")
    tokenizer_path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(tokenizer_path):
        raise ModelError(f"{tokenizer_path}: missing (only fast HF tokenizers are supported)")
    try:
        tokenizer = Tokenizer.from_file(tokenizer_path)
    except Exception as e:  # tokenizers raises its own Exception subclass
        raise ModelError(f"{tokenizer_path}: {e}") from None
    # transformers encodes with truncation and padding off unless asked (apply_chat_template
    # asks for neither): settings saved in tokenizer.json must not cut or pad a sample.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = _read_json(config_path, required=False)
    legacy_path = os.path.join(directory, "special_tokens_map.json")
    legacy = _read_json(legacy_path, required=False)

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
        generation = _read_json(os.path.join(directory, "generation_config.json"), False)
        value = generation.get("eos_token_id")
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            eos_id = value
    bos_id = None
    if config.get("add_bos_token") is True and "bos_token" in special:
        bos_id = tokenizer.token_to_id(special["bos_token"])
    return ModelText(tokenizer, _pick_template(config, directory, template_name), special,
                     eos_id, bos_id, special_ids)
