#!/usr/bin/env python3
"""By-hand check that a model exported by megatrain loads in Hugging Face
transformers and gives the engine's logits.

Usage (needs torch + transformers, e.g. the venv of tests/golden/README.md):
  scripts/bazel run //tests/checkpoint:export_sample -- $PWD/tests/golden/llama_tiny /tmp/export_llama
  /tmp/golden-venv/bin/python tests/golden/export_check.py /tmp/export_llama

The export directory holds config.json + model.safetensors (or shards) as
written by ExportHfModel / a checkpoint, and engine_logits.safetensors
(input_ids int32 [batch, seq] and the engine's fp32 logits [batch, seq, vocab]).
Any checkpoint directory works too when given --logits FILE.
Exit status 0 when max |HF - engine| <= --tol (default 1e-4: HF's own fp32
deviation from a float64 reference is ~1e-5 on the golden models).
"""
import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--logits", help="default: <model_dir>/engine_logits.safetensors")
    parser.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args()

    expected = load_file(args.logits or f"{args.model_dir}/engine_logits.safetensors")
    input_ids = expected["input_ids"].to(torch.long)
    engine_logits = expected["logits"]

    config = AutoConfig.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        hf_logits = model(input_ids=input_ids).logits.float()
    if hf_logits.shape != engine_logits.shape:
        print(f"FAIL: shape HF {tuple(hf_logits.shape)} vs engine {tuple(engine_logits.shape)}")
        return 1
    diff = (hf_logits - engine_logits).abs().max().item()
    scale = engine_logits.abs().max().item()
    print(f"{config.model_type} ({type(model).__name__}): loaded {args.model_dir}; "
          f"max |HF - engine| = {diff:.3e} (logits up to {scale:.3f}); tolerance {args.tol:g}")
    if not diff <= args.tol:
        print("FAIL")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
