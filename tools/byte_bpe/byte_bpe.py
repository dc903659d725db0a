"""byte_bpe.py: byte-level BPE tokenizers trained here (nothing comes from a hub) and the HF
tokenizer files written for them, with the Llama 3 style special tokens and chat template. Shared
by scripts/demo_sft_data.py (the SFT demo's tokenizer) and tests/python/hf_chat_fixtures.py (the
tests' tiny tokenizers); needs only `tokenizers` (scripts/setup's venv)."""

import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# The split pattern of Llama 3 / Qwen 2 style tokenizers (contractions, letters, 1-3 digits,
# punctuation runs, newlines, spaces).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]

# Llama 3 style: BOS, an optional system turn, a header per turn, each turn ended by <|eot_id|>
# (also the eos token, so generation stops there).
LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content'] | trim %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = '' %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- if system_message %}\n"
    "    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message"
    " + '<|eot_id|>' }}\n"
    "{%- endif %}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message['role'] not in ['user', 'assistant'] %}\n"
    "        {{- raise_exception('Only user and assistant turns follow the system') }}\n"
    "    {%- endif %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "    {{- message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)


def train(texts, special_tokens, vocab_size):
    """A byte-level BPE of `vocab_size` (special tokens included) trained on `texts`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def added_tokens_decoder(tokenizer, specials):
    """tokenizer_config.json's added_tokens_decoder for the special tokens `specials`."""
    return {str(tokenizer.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                            "rstrip": False, "single_word": False,
                                            "special": True} for t in specials}


def write_dir(directory, tokenizer, config, generation=None):
    """Writes tokenizer.json, tokenizer_config.json (`config` plus the fast-tokenizer keys) and,
    when given, generation_config.json into `directory`; returns `directory`."""
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = dict(config, tokenizer_class="PreTrainedTokenizerFast", model_max_length=1 << 20,
                  clean_up_tokenization_spaces=False)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    if generation is not None:
        with open(os.path.join(directory, "generation_config.json"), "w") as f:
            json.dump(generation, f)
    return directory
