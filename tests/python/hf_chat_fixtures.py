"""Tiny HF model directories for tests/python:hf_chat_test: a byte-level BPE trained here on a
few KB of mixed-script text, with each family's special tokens, and chat templates written for
these tests in the style of Llama 3 (header tokens + <|eot_id|>) and Qwen (<|im_start|> /
<|im_end|>, a default system prompt). Nothing comes from a hub. The BPE, the Llama 3 template and
the file writing are tools/byte_bpe's (found beside this file's tests/ folder)."""

import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "byte_bpe"))
import byte_bpe  # noqa: E402
from byte_bpe import LLAMA3_SPECIALS, LLAMA3_TEMPLATE  # noqa: E402

_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A helpful assistant answers the question and explains why.",
    "Summarize the following text in one sentence, please.",
    "Déjà vu: the café served crème brûlée and a piña colada.",
    "Ça va? Très bien, merci. Über die Brücke gehen wir später.",
    "日本語のテキストも少し含めます。東京は晴れです。",
    "中文句子：今天天气很好，我们去公园散步吧。",
    "Emoji time 🎉🚀 — the rocket launched 🌕 and everyone cheered 👏.",
    "Numbers like 12345 and 3.14159 appear in math problems.",
    "def add(a, b):\n    return a + b\n",
    "User asked: what is the capital of France? Paris is the answer.",
    "Translate to Spanish: good morning → buenos días.",
]


def corpus_text():
    lines = []
    for i in range(40):
        for j, s in enumerate(_SENTENCES):
            lines.append(s if (i + j) % 3 else s.upper())
    return "\n".join(lines)


def _train(special_tokens, vocab_size=600):
    return byte_bpe.train([corpus_text()], special_tokens, vocab_size)


QWEN_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {%- if loop.first and message.role != 'system' %}\n"
    "        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# ChatML with {% generation %} around each reply (spans taken from the template itself).
TAGGED_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' }}\n"
    "    {%- if message.role == 'assistant' %}\n"
    "        {%- generation %}\n"
    "            {{- message.content + '<|im_end|>' }}\n"
    "        {%- endgeneration %}\n"
    "    {%- else %}\n"
    "        {{- message.content + '<|im_end|>' }}\n"
    "    {%- endif %}\n"
    "    {{- '\\n' }}\n"
    "{%- endfor %}\n"
)

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_llama3(directory):
    """Llama 3 style: BOS written by the template AND by the post-processor for plain encode
    (so a tool that adds special tokens on top of the template would double it), and
    truncation and padding saved in tokenizer.json (which would cut or pad the samples)."""
    tokenizer = _train(LLAMA3_SPECIALS)
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    # Saved truncation and padding, which transformers turns off for apply_chat_template.
    tokenizer.enable_truncation(max_length=8)
    tokenizer.enable_padding(length=4096, pad_id=tokenizer.token_to_id("<|end_of_text|>"),
                             pad_token="<|end_of_text|>")
    return byte_bpe.write_dir(directory, tokenizer, {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "added_tokens_decoder": byte_bpe.added_tokens_decoder(tokenizer, LLAMA3_SPECIALS),
        "chat_template": LLAMA3_TEMPLATE,
    })


def make_qwen(directory, template=QWEN_TEMPLATE):
    tokenizer = _train(QWEN_SPECIALS)
    return byte_bpe.write_dir(directory, tokenizer, {
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "added_tokens_decoder": byte_bpe.added_tokens_decoder(tokenizer, QWEN_SPECIALS),
        "chat_template": template,
    })


def make_base(directory):
    """No chat template; EOS only in generation_config.json; add_bos_token."""
    tokenizer = _train(["<s>", "</s>"])
    return byte_bpe.write_dir(directory, tokenizer, {
        "bos_token": "<s>", "add_bos_token": True,
        "added_tokens_decoder": byte_bpe.added_tokens_decoder(tokenizer, ["<s>", "</s>"]),
    }, generation={"eos_token_id": [tokenizer.token_to_id("</s>")]})


def make_base_bos_by_post_processor(directory):
    """No chat template, no add_bos_token in the config: BOS comes from tokenizer.json's
    post-processor, as with Llama 3's base models."""
    tokenizer = _train(["<s>", "</s>"])
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return byte_bpe.write_dir(directory, tokenizer, {
        "bos_token": "<s>",
        "added_tokens_decoder": byte_bpe.added_tokens_decoder(tokenizer, ["<s>", "</s>"]),
    }, generation={"eos_token_id": [tokenizer.token_to_id("</s>")]})


def make_gpt2_style(directory, extra_config):
    """A top-level ByteLevel pre-tokenizer saved with add_prefix_space=True (transformers resets
    it to the config's add_prefix_space, default false) and ChatML markers."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=QWEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator([corpus_text()], trainer=trainer)
    return byte_bpe.write_dir(directory, tokenizer, dict({"eos_token": "<|im_end|>",
                                                          "chat_template": QWEN_TEMPLATE},
                                                         **extra_config))
