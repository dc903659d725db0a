"""--render / --decode: the chat template and tokenizer of a model directory for `sample --chat`
(engine/train/sample_main.cc) and a daemon job's data.eval_prompts (server/job_eval_prompts.cc),
which run this tool as a child process (the engine never links Python).

  --render JSON  JSON is {"messages": [{"role", "content"}...]}; prints one JSON line
                 {"ids": [...], "stop_ids": [...]}: the conversation rendered with the directory's
                 chat template and add_generation_prompt=True, encoded without added special
                 tokens (as apply_chat_template(tokenize=True) does), and the ids that end the
                 reply as transformers' generate() ends it: generation_config.json's
                 eos_token_id (one or a list), else config.json's, else the tokenizer's eos.
  --decode IDS   IDS is comma-separated token ids; prints {"text": ...}, decoded with special
                 tokens skipped (as tokenizer.decode(ids, skip_special_tokens=True)).
  --render_prompts JSON  JSON is a list of user messages; prints {"prompts": [[ids]...],
                 "stop_ids": [...], "vocab_size": N}: each as one user turn through --render, and
                 the tokenizer's size with added tokens (ids a reply may use and --decode takes).
  --decode_lists JSON    JSON is a list of id lists; prints {"texts": [...]}, each as --decode.
  --model_fds NAME=FD,...  the directory's files as inherited descriptors (as for tokenizing):
                 only these are read, never a path.

Exit 0 with the JSON line on stdout; 2 with one line on stderr for a bad argument or directory.
"""

import json

from . import model_dir
from .errors import ModelError
from .records import ROLES
from .template import ChatTemplate


def _json_file(files, name):
    if not files.exists(name):
        return {}
    try:
        value = json.loads(files.read_text(name))
    except ValueError as e:
        raise ModelError(f"{files.path(name)}: {e}") from None
    return value if isinstance(value, dict) else {}


def _token_ids(value):
    """eos_token_id as a list: one id, a list of ids, or none."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _stop_ids(model, directory, held=None):
    """The ids where transformers' generate() ends a reply: its generation config's
    eos_token_id, which from_pretrained reads from generation_config.json, else builds from
    config.json. Only where neither names one, the tokenizer's eos token (generate() would not
    stop at all; a chat reply should). `held`: the directory's files as inherited descriptors."""
    files = model_dir.Files(directory, held)
    for name in ("generation_config.json", "config.json"):
        ids = _token_ids(_json_file(files, name).get("eos_token_id"))
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


def _template(model, directory):
    if model.chat_template is None:
        raise ModelError(f"{directory}: tokenizer_config.json has no chat_template")
    return ChatTemplate(model.chat_template, model.special_tokens)


def _rendered_ids(model, template, messages):
    text = template.render(messages, add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special_tokens=False).ids


def render(directory, conversation_json, template_name=None, held=None):
    """The dict printed by --render; raises ModelError or ValueError (a bad conversation)."""
    model = model_dir.load(directory, template_name, held)
    template = _template(model, directory)
    ids = _rendered_ids(model, template, _messages(conversation_json))
    return {"ids": ids, "stop_ids": _stop_ids(model, directory, held)}


def render_prompts(directory, prompts_json, template_name=None, held=None):
    """The dict printed by --render_prompts; raises ModelError or ValueError (a bad list)."""
    try:
        prompts = json.loads(prompts_json)
    except ValueError as e:
        raise ValueError(f"--render_prompts: not JSON: {e}") from None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("--render_prompts: must be a list of strings")
    model = model_dir.load(directory, template_name, held)
    template = _template(model, directory)
    rendered = [_rendered_ids(model, template, [{"role": "user", "content": p}])
                for p in prompts]
    return {"prompts": rendered, "stop_ids": _stop_ids(model, directory, held),
            "vocab_size": model.tokenizer.get_vocab_size(with_added_tokens=True)}


def _checked_ids(model, ids, flag):
    vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
    bad = [i for i in ids if i >= vocab]
    if bad:
        raise ValueError(f"{flag}: token id {bad[0]} is outside the tokenizer's {vocab} ids")
    return ids


def decode(directory, ids_text, held=None):
    """The dict printed by --decode; raises ModelError or ValueError (a bad id list)."""
    model = model_dir.load(directory, None, held)
    ids = []
    for item in filter(None, ids_text.split(",")):
        if not item.isdigit():
            raise ValueError(f"--decode: '{item}' is not a token id")
        ids.append(int(item))
    _checked_ids(model, ids, "--decode")
    return {"text": model.tokenizer.decode(ids, skip_special_tokens=True)}


def decode_lists(directory, lists_json, held=None):
    """The dict printed by --decode_lists; raises ModelError or ValueError (a bad list)."""
    try:
        lists = json.loads(lists_json)
    except ValueError as e:
        raise ValueError(f"--decode_lists: not JSON: {e}") from None
    if not isinstance(lists, list) or not all(
            isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                          and i >= 0 for i in ids) for ids in lists):
        raise ValueError("--decode_lists: must be a list of lists of token ids")
    model = model_dir.load(directory, None, held)
    return {"texts": [model.tokenizer.decode(_checked_ids(model, ids, "--decode_lists"),
                                             skip_special_tokens=True) for ids in lists]}


def print_json(value):
    print(json.dumps(value, ensure_ascii=False))
