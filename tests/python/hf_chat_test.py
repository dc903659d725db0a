"""tools/hf_chat (megatrain_chat_tokenize) against transformers 4.55.4's apply_chat_template on
tiny tokenizers made here: token ids, assistant loss masks, validation errors, the MTSFT file,
flat memory, and the --render / --decode modes of `sample --chat`. Runs in scripts/setup's venv
(tests/python/hf_chat_test.sh)."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(ROOT, "tools", "hf_chat", "megatrain_chat_tokenize")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "hf_chat"))

import hf_chat_fixtures as fixtures  # noqa: E402
from hf_chat.sample_file import SampleSetWriter, read_sample_set  # noqa: E402
from hf_chat.template import ChatTemplate  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: E402

CONVERSATIONS = {
    "single_turn": [{"role": "user", "content": "What is the capital of France?"},
                    {"role": "assistant", "content": "Paris is the capital of France."}],
    "system_multi_turn": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Add 12 and 30."},
        {"role": "assistant", "content": "42."},
        {"role": "user", "content": "And times two?"},
        {"role": "assistant", "content": "84, because 42 × 2 = 84."}],
    "no_system_three_replies": [
        {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Hi again!"},
        {"role": "user", "content": "Once more."},
        {"role": "assistant", "content": "Hi, once more."}],
    "cjk": [{"role": "system", "content": "日本語で答えてください。"},
            {"role": "user", "content": "東京の天気は？"},
            {"role": "assistant", "content": "東京は晴れです。中文也可以：今天天气很好。"}],
    "emoji_accents": [
        {"role": "user", "content": "Crème brûlée or piña colada? 🎉"},
        {"role": "assistant", "content": "Déjà vu 🚀🌕 — both, s'il vous plaît! 👏"}],
    "whitespace_edges": [
        {"role": "user", "content": "  padded question \n"},
        {"role": "assistant", "content": "\n answer with spaces around  "},
        {"role": "user", "content": "next"},
        {"role": "assistant", "content": "line one\nline two\n\n"}],
    "empty_user": [{"role": "user", "content": ""},
                   {"role": "assistant", "content": "Nothing was asked."}],
}

END_TOKEN = {"llama3": "<|eot_id|>", "qwen": "<|im_end|>", "tagged": "<|im_end|>"}


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    return {
        "llama3": fixtures.make_llama3(str(base / "llama3")),
        "qwen": fixtures.make_qwen(str(base / "qwen")),
        "tagged": fixtures.make_qwen(str(base / "tagged"), fixtures.TAGGED_TEMPLATE),
        "base": fixtures.make_base(str(base / "base")),
    }


def write_jsonl(path, objects):
    with open(path, "w", encoding="utf-8") as f:
        for o in objects:
            f.write((o if isinstance(o, str) else json.dumps(o, ensure_ascii=False)) + "\n")
    return str(path)


def run_tool(model, out, inputs, *flags):
    return subprocess.run([sys.executable, TOOL, f"--model={model}", f"--out={out}", *flags,
                           *inputs], capture_output=True, text=True, timeout=600)


def tokenize_ok(model, tmp_path, objects, *flags):
    path = write_jsonl(tmp_path / "data.jsonl", objects)
    out = tmp_path / "data.mtsft"
    result = run_tool(model, out, [path], *flags)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    vocab, samples = read_sample_set(str(out))
    return json.loads(lines[0]), vocab, samples


def masked_runs(ids, mask):
    runs, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


@pytest.mark.parametrize("family", ["llama3", "qwen"])
def test_chat_ids_equal_transformers_and_masks_cover_replies(models, tmp_path, family):
    reference = AutoTokenizer.from_pretrained(models[family])
    names = sorted(CONVERSATIONS)
    summary, vocab, samples = tokenize_ok(
        models[family], tmp_path, [{"messages": CONVERSATIONS[n]} for n in names])
    assert summary["samples"] == len(names)
    assert summary["format"] == "mtsft" and summary["output_version"] == 1
    assert summary["vocab_size"] == vocab <= summary["tokenizer_vocab_size"] == len(reference)
    assert summary["formats"] == {"chat": len(names), "prompt_completion": 0, "alpaca": 0}
    assert summary["tokens"] == sum(len(ids) for ids, _ in samples)
    assert summary["counted_tokens"] == sum(sum(mask) for _, mask in samples)
    assert vocab == 1 + max(max(ids) for ids, _ in samples)
    for name, (ids, mask) in zip(names, samples):
        messages = CONVERSATIONS[name]
        expected = reference.apply_chat_template(messages, tokenize=True)
        assert ids == expected, name
        if family == "llama3":  # the template writes BOS; the tokenizer must not add another
            assert ids.count(reference.convert_tokens_to_ids("<|begin_of_text|>")) == 1
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        if family == "llama3":
            replies = [r.strip() for r in replies]  # the template trims contents
        runs = [reference.decode(r) for r in masked_runs(ids, mask)]
        assert len(runs) == len(replies), name
        for run, reply in zip(runs, replies):
            # Exactly the reply and its end token, except where one token spans the header's
            # last newline and the reply's first: that token counts (it produces reply text),
            # as a {% generation %} span's first token does in transformers.
            assert run.endswith(reply + END_TOKEN[family]), (name, run)
            extra = run[: len(run) - len(reply + END_TOKEN[family])]
            # (Qwen's header ends "\n"; a reply starting "\n" shares that token.)
            assert extra == ("\n" if family == "qwen" and reply.startswith("\n") else ""), \
                (name, run)


def test_generation_tags_give_transformers_assistant_mask(models, tmp_path):
    reference = AutoTokenizer.from_pretrained(models["tagged"])
    names = sorted(CONVERSATIONS)
    _, _, samples = tokenize_ok(models["tagged"], tmp_path,
                                [{"messages": CONVERSATIONS[n]} for n in names])
    for name, (ids, mask) in zip(names, samples):
        out = reference.apply_chat_template(CONVERSATIONS[name], tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        assert ids == out["input_ids"], name
        assert mask == out["assistant_masks"], name


@pytest.mark.parametrize("family", ["llama3", "qwen"])
def test_prompt_completion_and_alpaca_map_to_user_then_assistant(models, tmp_path, family):
    reference = AutoTokenizer.from_pretrained(models[family])
    pc = [{"prompt": "Name a color. 🎨", "completion": "Bleu, comme le ciel.", "id": 7},
          {"prompt": "", "completion": "An empty prompt is allowed."}]
    alpaca = [{"instruction": "Translate to Japanese.", "input": "Good morning",
               "output": "おはよう"},
              {"instruction": "Say something nice.", "input": "", "output": "You did well!"},
              {"instruction": "No input key here.", "output": "Fine."}]
    users = [pc[0]["prompt"], pc[1]["prompt"], "Translate to Japanese.\n\nGood morning",
             "Say something nice.", "No input key here."]
    replies = [pc[0]["completion"], pc[1]["completion"], "おはよう", "You did well!", "Fine."]
    a = write_jsonl(tmp_path / "pc.jsonl", pc)
    b = write_jsonl(tmp_path / "alpaca.jsonl", alpaca)
    out = tmp_path / "out.mtsft"
    result = run_tool(models[family], out, [a, b])
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["formats"] == {"chat": 0, "prompt_completion": 2, "alpaca": 3}
    _, samples = read_sample_set(str(out))
    for user, reply, (ids, mask) in zip(users, replies, samples):
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        assert ids == reference.apply_chat_template(messages, tokenize=True)
        assert [reference.decode(r) for r in masked_runs(ids, mask)] == \
            [reply + END_TOKEN[family]]
    longest = max(range(len(samples)), key=lambda i: len(samples[i][0]))
    assert summary["longest_sample"]["tokens"] == len(samples[longest][0])


def test_no_template_is_prompt_completion_eos(models, tmp_path):
    reference = AutoTokenizer.from_pretrained(models["base"])
    bos, eos = reference.convert_tokens_to_ids("<s>"), reference.convert_tokens_to_ids("</s>")
    rows = [{"prompt": "Question: 2+2? Answer:", "completion": " 4, ça va."},
            {"instruction": "List two fruits.", "output": "Apple, 芒果."}]
    _, _, samples = tokenize_ok(models["base"], tmp_path, rows[:1])
    ids, mask = samples[0]
    prompt = reference.encode(rows[0]["prompt"], add_special_tokens=False)
    completion = reference.encode(rows[0]["completion"], add_special_tokens=False)
    assert ids == [bos] + prompt + completion + [eos]
    assert mask == [0] * (1 + len(prompt)) + [1] * (len(completion) + 1)
    _, _, samples = tokenize_ok(models["base"], tmp_path, rows[1:])
    ids, mask = samples[0]
    assert reference.decode([t for t, m in zip(ids, mask) if m]) == "Apple, 芒果.</s>"
    assert reference.decode([t for t, m in zip(ids, mask) if not m]) == "<s>List two fruits."
    # Chat lines need a template.
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS["single_turn"]}])
    result = run_tool(models["base"], tmp_path / "x.mtsft", [path])
    assert result.returncode == 1
    assert f"{path}:1: field messages: the model directory has no chat_template" in result.stderr


def test_no_template_takes_bos_from_the_post_processor_when_the_config_is_silent(tmp_path):
    directory = fixtures.make_base_bos_by_post_processor(str(tmp_path / "base_pp"))
    reference = AutoTokenizer.from_pretrained(directory)
    bos, eos = reference.convert_tokens_to_ids("<s>"), reference.convert_tokens_to_ids("</s>")
    row = {"prompt": "Question: 2+2? Answer:", "completion": " 4"}
    prompt_as_transformers = reference.encode(row["prompt"])  # with its special tokens
    assert prompt_as_transformers[0] == bos
    _, _, samples = tokenize_ok(directory, tmp_path, [row])
    ids, mask = samples[0]
    completion = reference.encode(row["completion"], add_special_tokens=False)
    assert ids == prompt_as_transformers + completion + [eos]
    assert ids.count(bos) == 1
    assert mask == [0] * len(prompt_as_transformers) + [1] * (len(completion) + 1)


BAD_LINES = [
    ("{not json", None, "not JSON"),
    ('["a list"]', None, "must be a JSON object"),
    ('{"text": "plain"}', None, "not a chat, prompt_completion or alpaca line"),
    ('{"messages": [], "prompt": "p"}', "messages", "keys of several formats"),
    ('{"messages": "hi"}', "messages", "must be a list"),
    ('{"messages": []}', "messages", "must not be empty"),
    ('{"messages": ["hi"]}', "messages[0]", "must be an object"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', "messages[0].role",
     'must be one of system, user, assistant, not "bot"'),
    ('{"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}',
     "messages[0].content", "missing"),
    ('{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]}',
     "messages[0].content", "must be a string, not 5"),
    ('{"messages": [{"role": "user", "content": "q", "name": "x"}]}', "messages[0].name",
     "unsupported"),
    ('{"messages": [{"role": "user", "content": "q"}]}', "messages", "no assistant message"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}',
     "messages[1].content", "must not be empty"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, '
     '{"role": "assistant", "content": "a"}]}', "messages[1].role", "must come first"),
    ('{"prompt": "p"}', "completion", "missing"),
    ('{"prompt": "p", "completion": ""}', "completion", "must not be empty"),
    ('{"prompt": ["p"], "completion": "c"}', "prompt", "must be a string"),
    ('{"instruction": "i", "input": 3, "output": "o"}', "input", "must be a string, not 3"),
    ('{"instruction": "", "output": "o"}', "instruction", "must not be empty"),
    ('{"output": "o"}', "instruction", "missing"),
    ('{"prompt": "p", "prompt": "q", "completion": "c"}', None, 'duplicate key "prompt"'),
    ('{"prompt": NaN, "completion": "c"}', None, "NaN is not JSON"),
]


@pytest.mark.parametrize("line,field,message", BAD_LINES, ids=[b[2] for b in BAD_LINES])
def test_each_validation_error_names_file_line_and_field(models, tmp_path, line, field, message):
    good = json.dumps({"prompt": "fine", "completion": "also fine"})
    path = write_jsonl(tmp_path / "bad.jsonl", [good, "", line, good])
    out = tmp_path / "bad.mtsft"
    result = run_tool(models["qwen"], out, [path])
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    where = f"{path}:3: field {field}: " if field else f"{path}:3: "
    first = result.stderr.splitlines()[0]
    assert first.startswith(where) and message in first, result.stderr
    assert not out.exists()
    assert os.listdir(tmp_path) == ["bad.jsonl"]  # no spool or temporary left behind


def test_non_utf8_line_and_empty_input(models, tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "ok", "completion": "fine"}\n{"prompt": "caf\xe9", '
                     b'"completion": "x"}\n')
    result = run_tool(models["qwen"], tmp_path / "l.mtsft", [str(path)])
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:2: not UTF-8 (byte 15)"), result.stderr
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "   "])
    result = run_tool(models["qwen"], tmp_path / "e.mtsft", [empty])
    assert result.returncode == 1 and "the inputs hold no sample" in result.stderr
    assert not (tmp_path / "e.mtsft").exists()


def test_errors_are_all_listed_up_to_the_cap_and_old_output_survives(models, tmp_path):
    out = tmp_path / "keep.mtsft"
    out.write_bytes(b"old")
    path = write_jsonl(tmp_path / "many.jsonl", ["{}"] * 30)
    result = run_tool(models["qwen"], out, [path], "--max_errors=5")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert [l.split(": ")[0] for l in lines[:5]] == [f"{path}:{i}" for i in range(1, 6)]
    assert "stopped after 5 errors" in lines[5]
    assert out.read_bytes() == b"old"


def test_mixed_formats_refused_and_format_flag(models, tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        {"prompt": "p", "completion": "c"},
        {"instruction": "i", "output": "o"}])
    result = run_tool(models["qwen"], tmp_path / "m.mtsft", [path])
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:2: an alpaca line in a prompt_completion file "
                                    "(line 1)")
    result = run_tool(models["qwen"], tmp_path / "m.mtsft", [path], "--format=alpaca")
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:1: field instruction: missing")


def test_caps_on_line_size_and_message_count(models, tmp_path):
    long_line = json.dumps({"prompt": "x" * 5000, "completion": "c"})
    many = json.dumps({"messages": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": "a"}] * 3})
    path = write_jsonl(tmp_path / "caps.jsonl", [long_line, many])
    result = run_tool(models["qwen"], tmp_path / "c.mtsft", [path], "--max_line_bytes=4096",
                      "--max_messages=4", "--format=auto")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"{path}:1: line of {len(long_line)} bytes exceeds the cap of "
                               "4096"), lines
    assert lines[1].startswith(f"{path}:2: field messages: 6 messages exceed the cap of 4"), lines


def test_template_raise_exception_names_the_line(models, tmp_path):
    # The Llama 3 style template refuses a second system message through raise_exception;
    # the validator lets only a first system through, so use a template that refuses users.
    model = fixtures.make_qwen(str(tmp_path / "strict"),
                               "{% for m in messages %}{% if m.role == 'user' and 'bad' in "
                               "m.content %}{{ raise_exception('no bad words, please') }}"
                               "{% endif %}{{ m.content }}<|im_end|>{% endfor %}")
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "ok", "completion": "fine"},
                                              {"prompt": "bad", "completion": "fine"}])
    result = run_tool(model, tmp_path / "t.mtsft", [path])
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:2: field messages: the chat template refused it: "
                                    "no bad words, please")


def test_template_that_rewrites_earlier_turns_is_refused(models, tmp_path):
    # Marks only the last reply (as templates that keep only the last reply's reasoning do):
    # rendered up to an earlier reply, that reply is the last and comes out otherwise.
    model = fixtures.make_qwen(str(tmp_path / "rewrites"),
                               "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                               "{% if loop.last and m.role == 'assistant' %} (final){% endif %}<|im_end|>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    path = write_jsonl(tmp_path / "r.jsonl", [{"messages": CONVERSATIONS["single_turn"]},
                                              {"messages": CONVERSATIONS["system_multi_turn"]}])
    result = run_tool(model, tmp_path / "r.mtsft", [path])
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:2: field messages: messages[2]: the chat template "
                                    "renders the conversation"), result.stderr
    assert f"{path}:1" not in result.stderr  # one reply, the last: its span is found


def test_bad_model_directory_and_usage_exit_2(models, tmp_path):
    path = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "p", "completion": "c"}])
    result = run_tool(str(tmp_path / "nope"), tmp_path / "o.mtsft", [path])
    assert result.returncode == 2 and "not a directory" in result.stderr
    result = run_tool(models["qwen"], tmp_path / "o.mtsft", [str(tmp_path / "missing.jsonl")])
    assert result.returncode == 2 and "missing.jsonl: not a regular file" in result.stderr
    result = run_tool(models["qwen"], tmp_path / "o.mtsft", [path], "--format=csv")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    broken = fixtures.make_qwen(str(tmp_path / "broken"), "{% for m in messages %}")
    result = run_tool(broken, tmp_path / "o.mtsft", [path])
    assert result.returncode == 2 and "chat_template does not compile" in result.stderr
    assert result.stdout == ""


def test_named_templates_pick_default_or_the_named_one(models, tmp_path):
    directory = fixtures.make_qwen(str(tmp_path / "named"))
    config_path = os.path.join(directory, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = [{"name": "default", "template": fixtures.QWEN_TEMPLATE},
                               {"name": "plain", "template": "{% for m in messages %}"
                                "{{ m.content }}<|im_end|>{% endfor %}"}]
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    reference = AutoTokenizer.from_pretrained(directory)
    messages = CONVERSATIONS["emoji_accents"]
    _, _, samples = tokenize_ok(directory, tmp_path, [{"messages": messages}])
    assert samples[0][0] == reference.apply_chat_template(messages, tokenize=True)
    _, _, samples = tokenize_ok(directory, tmp_path, [{"messages": messages}],
                                "--template_name=plain")
    assert samples[0][0] == reference.apply_chat_template(messages, tokenize=True,
                                                          chat_template="plain")
    result = run_tool(directory, tmp_path / "n.mtsft",
                      [write_jsonl(tmp_path / "n.jsonl", [{"messages": messages}])],
                      "--template_name=fancy")
    assert result.returncode == 2 and "no chat template named 'fancy'" in result.stderr


def test_template_files_take_priority_over_the_config(models, tmp_path):
    directory = fixtures.make_qwen(str(tmp_path / "files"))
    with open(os.path.join(directory, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write("{% for m in messages %}<|im_start|>{{ m.role }}: {{ m.content }}<|im_end|>"
                "{% endfor %}")
    os.makedirs(os.path.join(directory, "additional_chat_templates"))
    with open(os.path.join(directory, "additional_chat_templates", "short.jinja"), "w",
              encoding="utf-8") as f:
        f.write("{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}")
    reference = AutoTokenizer.from_pretrained(directory)
    messages = CONVERSATIONS["cjk"]
    _, _, samples = tokenize_ok(directory, tmp_path, [{"messages": messages}])
    assert samples[0][0] == reference.apply_chat_template(messages, tokenize=True)
    assert reference.decode(samples[0][0]).startswith("<|im_start|>system: ")
    _, _, samples = tokenize_ok(directory, tmp_path, [{"messages": messages}],
                                "--template_name=short")
    ids, mask = samples[0]
    assert ids == reference.apply_chat_template(messages, tokenize=True, chat_template="short")
    assert [reference.decode(r) for r in masked_runs(ids, mask)] == \
        [messages[-1]["content"] + "<|im_end|>"]


def test_legacy_special_tokens_map_overrides_a_config_without_added_tokens(tmp_path):
    directory = fixtures.make_qwen(
        str(tmp_path / "legacy"),
        "{{ bos_token }}{% for m in messages %}{{ m.role }}\n{{ m.content }}{{ eos_token }}"
        "{% endfor %}{% if add_generation_prompt %}assistant\n{% endif %}")
    config_path = os.path.join(directory, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    del config["added_tokens_decoder"]
    config.update(eos_token="<|endoftext|>", bos_token=None)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    with open(os.path.join(directory, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": {"content": "<|im_start|>"}}, f)
    reference = AutoTokenizer.from_pretrained(directory)
    messages = CONVERSATIONS["system_multi_turn"]
    _, _, samples = tokenize_ok(directory, tmp_path, [{"messages": messages}])
    ids, mask = samples[0]
    assert ids == reference.apply_chat_template(messages, tokenize=True)
    assert reference.decode(ids).startswith("<|im_start|>system")
    assert [reference.decode(r) for r in masked_runs(ids, mask)] == \
        [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]


@pytest.mark.parametrize("extra_config", [
    {},
    {"add_prefix_space": True},
    {"additional_special_tokens": ["<|tool|>", "Paris"]},
    {"split_special_tokens": True},
], ids=["prefix_space_reset", "prefix_space_kept", "special_tokens_added", "split_special"])
def test_tokenizer_adjusted_as_transformers_loads_it(tmp_path, extra_config):
    directory = fixtures.make_gpt2_style(str(tmp_path / "gpt2"), extra_config)
    if "additional_special_tokens" in extra_config:
        with open(os.path.join(directory, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(fixtures.QWEN_TEMPLATE.replace("'<|im_end|>' + '\\n'",
                                                   "'<|im_end|><|tool|>' + '\\n'"))
    reference = AutoTokenizer.from_pretrained(directory)
    conversation = [{"role": "user", "content": "Paris? Write <|im_end|> literally."},
                    {"role": "assistant", "content": "Paris is the capital of France."}]
    _, _, samples = tokenize_ok(directory, tmp_path, [{"messages": conversation}])
    ids, mask = samples[0]
    assert ids == reference.apply_chat_template(conversation, tokenize=True)
    if "additional_special_tokens" in extra_config:
        assert reference.convert_tokens_to_ids("<|tool|>") in ids
    if not extra_config.get("split_special_tokens"):
        assert reference.decode([t for t, m in zip(ids, mask) if m]).startswith("Paris is")


ENVIRONMENT_SNIPPETS = [
    "{{ value | tojson }}",
    "{{ value | tojson(indent=2) }}",
    "{{ value | tojson(separators=(',', ':'), sort_keys=true) }}",
    "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
    "{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.content }}]{% endfor %}",
    "  {% if true %}\n    kept {{ bos_token }}\n  {% endif %}\n{{ eos_token }}\n",
    "{{ '<b>&</b>' }}{{ messages | length }}{{ value['k'] | default('d') }}",
]


@pytest.mark.parametrize("source", ENVIRONMENT_SNIPPETS)
def test_environment_renders_like_transformers(source):
    variables = {"bos_token": "<s>", "eos_token": "</s>"}
    value = {"k": "日本 é 🎉 <tag> & \"q\"", "n": [1, 2.5, None, True]}
    messages = CONVERSATIONS["system_multi_turn"]
    ours = ChatTemplate(source, variables)._template.render(
        messages=messages, value=value, add_generation_prompt=False, **variables)
    theirs = _compile_jinja_template(source).render(
        messages=messages, value=value, add_generation_prompt=False, **variables)
    assert ours == theirs
    if "tojson" in source:
        assert "日本" in ours  # not \u-escaped


def test_generation_tag_detected_only_as_a_tag():
    assert ChatTemplate("{%- generation -%}x{%- endgeneration %}", {}).has_generation_tags
    assert not ChatTemplate("{{ generation }}{% if generation %}{% endif %}", {}).has_generation_tags


def test_sandbox_refuses_unsafe_access():
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(Exception, match="unsafe"):
        template.render([{"role": "user", "content": "x"}])


def test_sample_file_round_trips(tmp_path):
    import random
    rng = random.Random(5)
    rows = []
    for n in [0, 1, 7, 300, 0, 2]:
        ids = [rng.randrange(0, 70000) for _ in range(n)]
        rows.append((ids, [rng.randrange(0, 2) for _ in range(n)]))
    writer = SampleSetWriter(str(tmp_path / "r.mtsft"))
    for ids, mask in rows:
        writer.add(ids, mask)
    writer.commit()
    data = (tmp_path / "r.mtsft").read_bytes()
    assert data[:8] == b"MTSFT\x00\x00\x01"
    total = sum(len(ids) for ids, _ in rows)
    assert int.from_bytes(data[8:16], "little") == len(rows)
    assert int.from_bytes(data[16:24], "little") == total
    assert len(data) == 32 + 8 * (len(rows) + 1) + 5 * total
    vocab, samples = read_sample_set(str(tmp_path / "r.mtsft"))
    assert samples == rows
    assert vocab == 1 + max(max(ids) for ids, _ in rows if ids)
    assert os.listdir(tmp_path) == ["r.mtsft"]
    writer = SampleSetWriter(str(tmp_path / "empty.mtsft"))
    writer.commit()
    assert read_sample_set(str(tmp_path / "empty.mtsft")) == (0, [])
    # The reader catches a torn file.
    (tmp_path / "torn.mtsft").write_bytes(data[:-1])
    with pytest.raises(ValueError, match="the header implies"):
        read_sample_set(str(tmp_path / "torn.mtsft"))


def test_output_replaces_atomically_and_refuses_nothing_else(models, tmp_path):
    out = tmp_path / "o.mtsft"
    rows = [{"prompt": "p", "completion": "c"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    assert run_tool(models["qwen"], out, [path]).returncode == 0
    first = out.read_bytes()
    assert run_tool(models["qwen"], out, [path]).returncode == 0
    assert out.read_bytes() == first
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl", "o.mtsft"]


def test_held_descriptors_are_read_and_the_paths_never(models, tmp_path):
    """--input_fds / --model_fds (megatraind's checked files): the same bytes as by path, read
    from the descriptors even once the paths are gone; the names only label errors."""
    rows = [{"messages": [{"role": "user", "content": "Ça va?"},
                          {"role": "assistant", "content": "Très bien, merci."}]},
            {"prompt": "one", "completion": "two"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows[:1])
    by_path = tmp_path / "by_path.mtsft"
    assert run_tool(models["llama3"], by_path, [path]).returncode == 0
    model = models["llama3"]
    names = [n for n in sorted(os.listdir(model)) if n != "config.json"]
    fds = {n: os.open(os.path.join(model, n), os.O_RDONLY) for n in names}
    data_fd = os.open(path, os.O_RDONLY)
    bad_path = write_jsonl(tmp_path / "bad.jsonl", rows)
    bad_fd = os.open(bad_path, os.O_RDONLY)
    os.remove(path)
    os.remove(bad_path)
    model_fds = ",".join(f"{n}={fd}" for n, fd in fds.items())
    try:
        def run(fd, out, label):
            return subprocess.run(
                [sys.executable, TOOL, f"--model={tmp_path}/nowhere", f"--out={out}",
                 f"--input_fds={fd}", f"--model_fds={model_fds}", "--", label],
                capture_output=True, text=True, timeout=600, pass_fds=[fd, *fds.values()])
        held = tmp_path / "held.mtsft"
        result = run(data_fd, held, "label.jsonl")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["output_version"] == 1
        assert held.read_bytes() == by_path.read_bytes()
        result = run(bad_fd, tmp_path / "bad.mtsft", "label.jsonl")
        assert result.returncode == 1
        assert "label.jsonl:2:" in result.stderr
        # Without tokenizer.json among the descriptors the directory has none.
        only_config = ",".join(f"{n}={fd}" for n, fd in fds.items() if n != "tokenizer.json")
        result = subprocess.run(
            [sys.executable, TOOL, f"--model={model}", f"--out={tmp_path}/x.mtsft",
             f"--input_fds={data_fd}", f"--model_fds={only_config}", "--", "label.jsonl"],
            capture_output=True, text=True, timeout=600, pass_fds=[data_fd, *fds.values()])
        assert result.returncode == 2 and "tokenizer.json: missing" in result.stderr
    finally:
        for fd in [data_fd, bad_fd, *fds.values()]:
            os.close(fd)


def peak_rss_kib(command):
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
             "assert r.returncode == 0, r\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True,
                         text=True, timeout=600, check=True)
    return int(out.stdout)


def test_memory_does_not_grow_with_the_corpus(models, tmp_path):
    # ~13 MB of JSONL, 4.6M tokens: as Python lists that would be over 100 MiB.
    reply = " ".join(fixtures._SENTENCES) * 2
    big = tmp_path / "big.jsonl"
    with open(big, "w", encoding="utf-8") as f:
        line = json.dumps({"messages": [{"role": "user", "content": "Repeat this."},
                                        {"role": "assistant", "content": reply}]},
                          ensure_ascii=False)
        for _ in range(9000):
            f.write(line + "\n")
    small = write_jsonl(tmp_path / "small.jsonl", [json.loads(line)])
    model = models["qwen"]
    tiny_kib = peak_rss_kib([sys.executable, TOOL, f"--model={model}",
                             f"--out={tmp_path / 's.mtsft'}", small])
    big_kib = peak_rss_kib([sys.executable, TOOL, f"--model={model}",
                            f"--out={tmp_path / 'b.mtsft'}", str(big)])
    _, samples = read_sample_set(str(tmp_path / "s.mtsft"))
    tokens = 9000 * len(samples[0][0])
    assert os.path.getsize(tmp_path / "b.mtsft") == 32 + 8 * 9001 + 5 * tokens
    # Measured: about 2 MiB apart. Even packed arrays of the ids and masks would add 22 MiB.
    assert big_kib - tiny_kib < 12 * 1024, (tiny_kib, big_kib, tokens)


# --render / --decode: what `sample --chat` (engine/train/sample_chat.cc) asks the tool.
def run_chat_io(model, *flags):
    return subprocess.run([sys.executable, TOOL, f"--model={model}", *flags],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("family", ["llama3", "qwen"])
@pytest.mark.parametrize("name", ["single_turn", "system_multi_turn", "cjk", "emoji_accents"])
def test_render_for_a_reply_equals_transformers_generation_prompt(models, family, name):
    # The conversation up to its last user turn, as a caller asks for the next reply.
    messages = CONVERSATIONS[name][:-1]
    done = run_chat_io(models[family], "--render", json.dumps({"messages": messages}))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    hf = AutoTokenizer.from_pretrained(models[family])
    expected = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert got["ids"] == list(expected)
    assert got["stop_ids"] == [hf.convert_tokens_to_ids(END_TOKEN[family])]


def test_render_stop_ids_are_where_generate_stops(models, tmp_path):
    # transformers' generate() ends at its generation config's eos_token_id: generation_config.json
    # (Llama 3 names both end tokens there), else config.json's, never the tokenizer's eos token
    # (which only a directory naming neither falls back to).
    model = fixtures.make_llama3(str(tmp_path / "llama3"))
    hf = AutoTokenizer.from_pretrained(model)
    eot, end = hf.convert_tokens_to_ids("<|eot_id|>"), hf.convert_tokens_to_ids("<|end_of_text|>")
    hi = json.dumps({"messages": [{"role": "user", "content": "Hi"}]})

    def stop_ids():
        done = run_chat_io(model, "--render", hi)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["stop_ids"]

    assert stop_ids() == [eot]
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "eos_token_id": end}, f)
    assert stop_ids() == [end]
    with open(os.path.join(model, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [end, eot, end]}, f)
    assert stop_ids() == [end, eot]
    with open(os.path.join(model, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eot, "do_sample": True}, f)
    assert stop_ids() == [eot]


@pytest.mark.parametrize("family", ["llama3", "qwen"])
def test_decode_equals_transformers_decode_skipping_special_tokens(models, family):
    hf = AutoTokenizer.from_pretrained(models[family])
    for name in ("system_multi_turn", "cjk", "emoji_accents", "whitespace_edges"):
        ids = hf.apply_chat_template(CONVERSATIONS[name], tokenize=True)
        done = run_chat_io(models[family], "--decode", ",".join(map(str, ids)))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["text"] == hf.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("flags,message", [
    (["--render", "not json"], "--render: not JSON"),
    (["--render", '{"messages": []}'], "field messages: must be a non-empty list"),
    (["--render", '{"messages": [{"role": "robot", "content": "x"}]}'], "field messages[0]"),
    (["--decode", "1,x"], "'x' is not a token id"),
    (["--decode", "99999"], "token id 99999 is outside the tokenizer's"),
    (["--render", "{}", "--decode", "1"], "not allowed with argument"),
])
def test_chat_io_bad_arguments_exit_2_with_one_line(models, flags, message):
    done = run_chat_io(models["llama3"], *flags)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1 and not done.stdout


def test_render_without_a_template_is_refused(models):
    done = run_chat_io(models["base"], "--render",
                       '{"messages": [{"role": "user", "content": "x"}]}')
    assert done.returncode == 2
    assert "has no chat_template" in done.stderr


# --render_prompts / --decode_lists: a daemon job's data.eval_prompts (server/job_eval_prompts.cc),
# through held descriptors as megatraind passes them.
@pytest.mark.parametrize("family", ["llama3", "qwen"])
def test_render_prompts_and_decode_lists_equal_transformers_through_held_files(models, family,
                                                                               tmp_path):
    model = models[family]
    hf = AutoTokenizer.from_pretrained(model)
    prompts = ["Tell me a fortune.", "日本の首都は? 🗼", "  spaces, \"quotes\"\nand a newline "]
    names = [n for n in sorted(os.listdir(model)) if n != "config.json"]
    fds = {n: os.open(os.path.join(model, n), os.O_RDONLY) for n in names}
    model_fds = ",".join(f"{n}={fd}" for n, fd in fds.items())
    try:
        def run(*flags):
            return subprocess.run([sys.executable, TOOL, f"--model={tmp_path}/nowhere",
                                   f"--model_fds={model_fds}", *flags], capture_output=True,
                                  text=True, timeout=600, pass_fds=list(fds.values()))
        done = run("--render_prompts", json.dumps(prompts))
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got["prompts"] == [
            list(hf.apply_chat_template([{"role": "user", "content": p}],
                                        add_generation_prompt=True, tokenize=True))
            for p in prompts]
        assert got["stop_ids"] == [hf.convert_tokens_to_ids(END_TOKEN[family])]
        assert got["vocab_size"] == len(hf)
        lists = [hf.apply_chat_template(CONVERSATIONS[name], tokenize=True)
                 for name in ("cjk", "emoji_accents")] + [[]]
        done = run("--decode_lists", json.dumps(lists))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["texts"] == [hf.decode(ids, skip_special_tokens=True)
                                                    for ids in lists]
    finally:
        for fd in fds.values():
            os.close(fd)


@pytest.mark.parametrize("flags,message", [
    (["--render_prompts", '"one"'], "--render_prompts: must be a list of strings"),
    (["--render_prompts", "[1]"], "--render_prompts: must be a list of strings"),
    (["--decode_lists", "[1, 2]"], "--decode_lists: must be a list of lists of token ids"),
    (["--decode_lists", "[[99999]]"], "token id 99999 is outside the tokenizer's"),
    (["--render_prompts", "[]", "--model_fds=x"], "--model_fds: "),
])
def test_list_modes_bad_arguments_exit_2_with_one_line(models, flags, message):
    done = run_chat_io(models["llama3"], *flags)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1 and not done.stdout
