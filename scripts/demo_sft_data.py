"""demo_sft_data.py: the inputs of scripts/demo-sft, from Debian's fortune files (no downloads).

Run with scripts/setup's venv Python (it needs `tokenizers`). Writes into OUT:
  chat.jsonl       conversations: the user asks for a fortune about a topic word taken from the
                   fortune, the assistant answers "About <word>: <the fortune>" (shuffled, fixed
                   seed; the daemon holds out the last lines as the validation set)
  hf/              tokenizer.json (a byte-level BPE trained here on the same fortunes, with
                   Llama-3-style special tokens), tokenizer_config.json (tools/byte_bpe's
                   Llama-3-style chat template) and generation_config.json
  model.json       a small Llama config whose vocabulary covers the tokenizer (the demo starts it
                   from random weights made by a one-step job)
  init.txt         a little plain text for that one-step job
  prompts.txt      the fixed prompts the demo asks before and after training, one per line
"""

import argparse
import glob
import json
import os
import random
import re
import sys

# The byte-level BPE, the Llama 3 style special tokens and chat template, and the tokenizer files:
# tools/byte_bpe, shared with the tests' fixtures.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "byte_bpe"))
import byte_bpe  # noqa: E402
from byte_bpe import LLAMA3_SPECIALS, LLAMA3_TEMPLATE  # noqa: E402

# Several phrasings so the model learns the request, not one string.
ASKS = ["Tell me a fortune about {}.", "Give me a saying about {}.",
        "What does the fortune say about {}?", "I would like a quote about {}."]

# Words too common to be a topic.
STOP = set("""about above after again against because before being below between could doesn't
during every having itself might other ought should their theirs there these they'd they'll
they're they've those through under until while which would you'd you'll you're you've yours
yourself never always something nothing anything everything people where whose whom shall
thing things still without within first""".split())


def read_fortunes(directory):
    """Fortunes (whitespace collapsed) of the plain fortune files, in file order."""
    fortunes = []
    for path in sorted(glob.glob(os.path.join(directory, "*"))):
        if not os.path.isfile(path) or path.endswith((".dat", ".u8")) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for block in f.read().split("\n%\n"):
                text = " ".join(block.split())
                if text and text.isascii():
                    fortunes.append(text)
    return fortunes


def topic(text):
    """The longest word of five letters or more that is not a stop word (first on ties)."""
    best = ""
    for word in re.findall(r"[A-Za-z]+", text):
        w = word.lower()
        if len(w) >= 5 and w not in STOP and len(w) > len(best):
            best = w
    return best


def make_conversations(fortunes, count, max_chars, seed):
    rng = random.Random(seed)
    seen, conversations = set(), []
    for text in fortunes:
        if len(text) > max_chars or len(text) < 20 or text in seen:
            continue
        word = topic(text)
        if not word:
            continue
        seen.add(text)
        ask = ASKS[len(conversations) % len(ASKS)].format(word)
        # The reply restates the topic: a pattern (and a copy from the prompt) a small model
        # picks up within the demo's few minutes, on top of the fortunes' text.
        conversations.append({"messages": [{"role": "user", "content": ask},
                                           {"role": "assistant",
                                            "content": f"About {word}: {text}"}]})
    rng.shuffle(conversations)
    return conversations[:count]


def write_model_dir(directory, tokenizer):
    ids = {t: tokenizer.token_to_id(t) for t in LLAMA3_SPECIALS}
    byte_bpe.write_dir(directory, tokenizer, {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "added_tokens_decoder": byte_bpe.added_tokens_decoder(tokenizer, LLAMA3_SPECIALS),
        "chat_template": LLAMA3_TEMPLATE,
    }, generation={"bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": ids["<|eot_id|>"],
                   "do_sample": False})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fortunes", default="/usr/share/games/fortunes")
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--max_chars", type=int, default=120, help="longest fortune kept")
    p.add_argument("--vocab_size", type=int, default=1024)
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()

    fortunes = read_fortunes(args.fortunes)
    conversations = make_conversations(fortunes, args.samples, args.max_chars, args.seed)
    if len(conversations) < 100:
        raise SystemExit(f"{args.fortunes}: only {len(conversations)} usable fortunes "
                         "(install the fortunes packages: scripts/setup)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "chat.jsonl"), "w", encoding="utf-8") as f:
        for c in conversations:
            f.write(json.dumps(c) + "\n")

    texts = [m["content"] for c in conversations for m in c["messages"]]
    tokenizer = byte_bpe.train(texts, LLAMA3_SPECIALS, args.vocab_size)
    write_model_dir(os.path.join(args.out, "hf"), tokenizer)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    with open(os.path.join(args.out, "model.json"), "w") as f:
        json.dump({"model_type": "llama", "vocab_size": (vocab + 63) // 64 * 64,
                   "hidden_size": args.hidden_size, "intermediate_size": 3 * args.hidden_size,
                   "num_hidden_layers": args.layers, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "max_position_embeddings": 512}, f, indent=2)
    with open(os.path.join(args.out, "init.txt"), "w", encoding="utf-8") as f:
        f.write("\n%\n".join(fortunes[:200]) + "\n")
    with open(os.path.join(args.out, "prompts.txt"), "w") as f:
        f.write("Tell me a fortune about computers.\nGive me a saying about love.\n"
                "What does the fortune say about money?\n")
    print(json.dumps({"conversations": len(conversations), "tokenizer_vocab": vocab,
                      "out": args.out}))


if __name__ == "__main__":
    main()
