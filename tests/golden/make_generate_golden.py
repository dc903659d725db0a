"""Writes <export>/generate.json: transformers' greedy replies to fixed chat prompts from the
fine-tuned export tests/golden/sft_export_tiny (made by make_sft_export.sh), loaded exactly as a
user loads it (AutoModelForCausalLM / AutoTokenizer.from_pretrained, fp32, generate with
do_sample=False). tests/golden:sft_generate_test checks that `sample --chat` gives the same
prompt ids, reply ids and text. Needs torch and transformers (requirements.txt); CI never runs it.

Usage: python tests/golden/make_generate_golden.py [--export tests/golden/sft_export_tiny]
"""

import argparse
import hashlib
import json
import os
import re
import sys

os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}

# name, messages, max_new_tokens. The last one is cut by max_new_tokens before its end of turn.
CASES = [
    ("single_turn", [{"role": "user", "content": "Tell me about Paris."}], 24),
    ("system_multi_turn", [
        SYSTEM,
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "What do you know about the rocket?"},
    ], 24),
    ("non_ascii", [{"role": "user",
                    "content": "Ça va? 東京は晴れです 🎉. Say something on the café."}], 24),
    ("cut_by_length", [SYSTEM, {"role": "user", "content": "Tell me about Tokyo."}], 5),
]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load(export):
    model, info = AutoModelForCausalLM.from_pretrained(export, torch_dtype=torch.float32,
                                                       output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"{export}: loading was not clean: {problems}"
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, (name, p.dtype)
    model.eval()
    return model, AutoTokenizer.from_pretrained(export)


def greedy(model, generation_eos, prompt_ids, max_new_tokens):
    """generate(do_sample=False) and, per step, the margin between the two largest logits."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, return_dict_in_generate=True,
                         output_logits=True)
    reply = out.sequences[0, len(prompt_ids):].tolist()
    assert len(reply) == len(out.logits), (len(reply), len(out.logits))
    margins = []
    for step, logits in enumerate(out.logits):
        top = torch.topk(logits[0].double(), 2)
        assert top.indices[0].item() == reply[step], (step, top, reply)
        margins.append(float(top.values[0] - top.values[1]))
    # The same replies from full forwards without the KV cache: the reference is the model, not
    # generate's cache.
    sequence = list(prompt_ids)
    for token in reply:
        with torch.no_grad():
            logits = model(torch.tensor([sequence]), use_cache=False).logits[0, -1]
        assert int(torch.argmax(logits)) == token, (sequence, token)
        sequence.append(token)
    ended = bool(reply) and reply[-1] in generation_eos
    assert ended or len(reply) == max_new_tokens, reply
    return reply, margins, ended


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--export", default=os.path.join(HERE, "sft_export_tiny"))
    args = p.parse_args()
    assert transformers.__version__.startswith("4."), transformers.__version__
    model, tokenizer = load(args.export)
    eos = model.generation_config.eos_token_id
    generation_eos = eos if isinstance(eos, list) else [eos]
    print("generation_config:", model.generation_config.to_json_string(use_diff=True))
    cases = []
    for name, messages, max_new_tokens in CASES:
        prompt_ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=True))
        reply, margins, ended = greedy(model, generation_eos, prompt_ids, max_new_tokens)
        text = tokenizer.decode(reply, skip_special_tokens=True)
        print(f"{name}: {len(prompt_ids)} prompt ids, reply {reply} {text!r}, "
              f"smallest margin {min(margins):.4f}")
        cases.append({"name": name, "messages": messages, "max_new_tokens": max_new_tokens,
                      "prompt_ids": prompt_ids, "reply_ids": reply, "text": text,
                      "ended_at_eos": ended,
                      "logit_margins": [round(m, 6) for m in margins]})
    files = sorted(f for f in os.listdir(args.export) if f != "generate.json")
    golden = {
        "what": "transformers' greedy generate() on this directory, loaded with "
                "AutoModelForCausalLM/AutoTokenizer.from_pretrained in fp32; prompt_ids from "
                "apply_chat_template(add_generation_prompt=True, tokenize=True); reply_ids are "
                "the new tokens (ending with an eos of generation_config.json unless "
                "max_new_tokens cut them); text = decode(reply_ids, skip_special_tokens=True); "
                "logit_margins: per reply token, its logit minus the runner-up's",
        "generation_eos_token_ids": generation_eos,
        "smallest_logit_margin": round(min(min(c["logit_margins"]) for c in cases), 6),
        "cases": cases,
        "files_sha256": {f: sha256(os.path.join(args.export, f)) for f in files},
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }
    out = os.path.join(args.export, "generate.json")
    text = json.dumps(golden, ensure_ascii=False, indent=1)
    # Lists of numbers on one line each.
    text = re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]",
                  lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
