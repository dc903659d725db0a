"""--render / --decode: the chat template and tokenizer of a model directory for `sample --chat`
(engine/train/sample_main.cc), which runs this tool as a child process (the engine never links
Python).

  --render JSON  JSON is {"messages": [{"role", "content"}...]}; prints one JSON line
                 {"ids": [...], "stop_ids": [...]}: the conversation rendered with the directory's
                 chat template and add_generation_prompt=True, encoded without added special
                 tokens (as apply_chat_template(tokenize=True) does), and the ids that end the
                 reply as transformers' generate() ends it: generation_config.json's
                 eos_token_id (one or a list), else config.json's, else the tokenizer's eos.
  --decode IDS   IDS is comma-separated token ids; prints {"text": ...}, decoded with special
                 tokens skipped (as tokenizer.decode(ids, skip_special_tokens=True)).

Exit 0 with the JSON line on stdout; 2 with one line on stderr for a bad argument or directory.
"""

import json
import os

from . import model_dir
from .errors import ModelError
from .records import ROLES
from .template import ChatTemplate


def _json_file(directory, name):
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except ValueError as e:
        raise ModelError(f"{path}: {e}") from None
    return value if isinstance(value, dict) else {}


def _token_ids(value):
    """eos_token_id as a list: one id, a list of ids, or none."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _stop_ids(model, directory):
    """The ids where transformers' generate() ends a reply: its generation config's
    eos_token_id, which from_pretrained reads from generation_config.json, else builds from
    config.json. Only where neither names one, the tokenizer's eos token (generate() would not
    stop at all; a chat reply should)."""
    for name in ("generation_config.json", "config.json"):
        ids = _token_ids(_json_file(directory, name).get("eos_token_id"))
        if ids:
            return list(dict.fromkeys(ids))
    return [] if model.eos_id is None else [model.eos_id]


def _messages(conversation_json):
    """The messages of {"messages": [...]}, each {"role", "content"}; raises ValueError."""
    try:
        obj = json.loads(conversation_json)
    except ValueError as e:
        raise ValueError(f"--render: not JSON: {e}") from None
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError("--render: field messages: must be a non-empty list")
    for i, m in enumerate(messages):
        if (not isinstance(m, dict) or set(m) != {"role", "content"} or m["role"] not in ROLES
                or not isinstance(m["content"], str)):
            raise ValueError(f"--render: field messages[{i}]: must be {{\"role\": one of "
                             f"{', '.join(ROLES)}, \"content\": a string}}, not {m!r:.80}")
    return messages


def render(directory, conversation_json, template_name=None):
    """The dict printed by --render; raises ModelError or ValueError (a bad conversation)."""
    model = model_dir.load(directory, template_name)
    if model.chat_template is None:
        raise ModelError(f"{directory}: tokenizer_config.json has no chat_template")
    template = ChatTemplate(model.chat_template, model.special_tokens)
    text = template.render(_messages(conversation_json), add_generation_prompt=True)
    ids = model.tokenizer.encode(text, add_special_tokens=False).ids
    return {"ids": ids, "stop_ids": _stop_ids(model, directory)}


def decode(directory, ids_text):
    """The dict printed by --decode; raises ModelError or ValueError (a bad id list)."""
    model = model_dir.load(directory)
    ids = []
    for item in filter(None, ids_text.split(",")):
        if not item.isdigit():
            raise ValueError(f"--decode: '{item}' is not a token id")
        ids.append(int(item))
    vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
    bad = [i for i in ids if i >= vocab]
    if bad:
        raise ValueError(f"--decode: token id {bad[0]} is outside the tokenizer's {vocab} ids")
    return {"text": model.tokenizer.decode(ids, skip_special_tokens=True)}


def print_json(value):
    print(json.dumps(value, ensure_ascii=False))
