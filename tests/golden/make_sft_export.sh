#!/usr/bin/env bash
# Makes tests/golden/sft_export_tiny: the Hugging Face files of a real fine-tuning checkpoint of
# the project (README.md, "sft_export_tiny"). A tiny Llama with a byte-level BPE and a
# Llama-3-style chat template (tests/python/hf_chat_fixtures.make_llama3) and a Llama-3-style
# generation_config.json gets random weights from a one-step train_local run, then train_local
# fine-tunes it (--init_from the HF directory, --sft_samples from tools/hf_chat) on chat
# conversations; the last checkpoint carries the tokenizer files and generation_config.json
# (engine/model/hf_companion_files) and its HF files become the fixture. Needs scripts/setup's
# venv only (no torch). Then tests/golden/make_generate_golden.py writes generate.json.
# Usage: tests/golden/make_sft_export.sh [OUT_DIR]   (default tests/golden/sft_export_tiny)
set -euo pipefail
[[ "${1:-}" == --help ]] && { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | grep -v '^set -'; exit 0; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${1:-tests/golden/sft_export_tiny}"
python=.cache/hf-venv/bin/python

scripts/bazel build //engine/train:train_local
bin="$(scripts/bazel info bazel-bin 2>/dev/null)"
work="$(mktemp -d /tmp/make-sft-export.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/hf"

# The tokenizer, chat template, model config, generation config and the chat data.
"$python" - "$work" <<'EOF'
import json, os, sys
sys.path.insert(0, "tests/python")
import hf_chat_fixtures as f
work = sys.argv[1]
f.make_llama3(os.path.join(work, "hf"))
from tokenizers import Tokenizer
t = Tokenizer.from_file(os.path.join(work, "hf", "tokenizer.json"))
bos, end, eot = (t.token_to_id(s) for s in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"))
model = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
         "vocab_size": t.get_vocab_size(with_added_tokens=True), "hidden_size": 32,
         "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": bos,
         "eos_token_id": end, "torch_dtype": "float32"}
json.dump(model, open(os.path.join(work, "model.json"), "w"), indent=2)
# As Llama 3 Instruct's: both end tokens, and sampling defaults a greedy caller overrides.
json.dump({"bos_token_id": bos, "eos_token_id": [end, eot], "do_sample": True,
           "temperature": 0.6, "top_p": 0.9},
          open(os.path.join(work, "hf", "generation_config.json"), "w"), indent=2)
with open(os.path.join(work, "init.txt"), "w") as o:
    o.write(f.corpus_text())
# Replies a tiny model learns in a few dozen steps: a fixed opening, the question's topic, the
# end of turn. Some with a system message, some multi-turn, some non-ASCII.
topics = ["the fox", "the café", "Tokyo", "the rocket", "numbers", "Paris", "the park",
          "the bridge"]
questions = ["Tell me about {}.", "What do you know about {}?", "Say something on {}."]
with open(os.path.join(work, "chat.jsonl"), "w", encoding="utf-8") as o:
    for i in range(96):
        topic, question = topics[i % len(topics)], questions[i % len(questions)]
        messages = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": "You are a helpful assistant."})
        if i % 4 == 1:
            messages += [{"role": "user", "content": "Hello!"},
                         {"role": "assistant", "content": "Hello! How can I help?"}]
        messages += [{"role": "user", "content": question.format(topic)},
                     {"role": "assistant", "content": f"A helpful answer about {topic}."}]
        o.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
EOF

tools/hf_chat/megatrain_chat_tokenize --model="$work/hf" --out="$work/chat.mtsft" \
  "$work/chat.jsonl"
# Random initial weights in HF form: one step of a tiny learning rate on a little text.
"$bin/engine/train/train_local" --config="$work/model.json" --text="$work/init.txt" --steps=1 \
  --micro_batch=1 --seq_len=32 --lr=1e-6 --warmup=0 --eval_every=0 --seed=17 \
  --checkpoint_dir="$work/init" > "$work/init.log"
cp "$work"/init/step-*/config.json "$work"/init/step-*/model.safetensors "$work/hf/"
# The fine-tuning run (assistant tokens only, packed).
"$bin/engine/train/train_local" --init_from="$work/hf" --sft_samples="$work/chat.mtsft" \
  --steps=200 --micro_batch=4 --seq_len=128 --lr=5e-3 --warmup=10 --eval_every=0 --seed=17 \
  --checkpoint_dir="$work/sft" 2>&1 | tail -1
last="$(ls -d "$work"/sft/step-* | sort -t- -k2 -n | tail -1)"
rm -rf "$out"
mkdir -p "$out"
for name in config.json model.safetensors tokenizer.json tokenizer_config.json \
    generation_config.json; do
  cp "$last/$name" "$out/"
done
ls -l "$out"
