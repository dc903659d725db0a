#!/usr/bin/env python3
# Generator of the golden training fixtures (llama_tiny, qwen2_tiny, qwen3_tiny) from HF transformers in float64.
"""Writes tests/golden/<fixture>/{config.json, model.safetensors, golden.safetensors, golden.json}.

Not run by CI: the outputs are committed. See README.md in this folder for the
contract the fixtures pin down and how to regenerate them:

    pip install -r tests/golden/requirements.txt
    python3 tests/golden/make_golden.py            # every fixture, next to this script
    python3 tests/golden/make_golden.py --out /tmp/g --only qwen2_tiny
"""

import argparse
import copy
import json
import os
import platform
import sys

import numpy
import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

sys.dont_write_bytecode = True  # keep tests/golden free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exact_fp64 import make_hf_model_exact, reference_logits, rope_inverse_frequencies  # noqa: E402

IGNORE_INDEX = -100
STEPS = 3
MICRO_BATCHES = 2  # micro-batches accumulated per optimizer step
BATCH = 2  # rows per micro-batch
SEQ = 19
LRS = [1e-2, 2e-2, 3e-2]  # warmup; large enough that weights move visibly
BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1  # 2-D weights (projections, embedding, lm_head); 0 for norms and biases
INIT_STD_MATRIX = 0.2
INIT_STD_NORM_NOISE = 0.1  # norm weights = 1 + N(0, 0.1^2)
INIT_STD_BIAS = 0.1
TORCH_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6)

FIXTURES = {
    "llama_tiny": dict(
        model_class=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            vocab_size=96,
            hidden_size=48,
            intermediate_size=72,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            max_position_embeddings=64,
            attention_bias=False,
            mlp_bias=False,
        ),
        init_seed=1234,
        data_seed=4321,
        # Below every step's pre-clip norm (asserted), so the clip is active at all 3 steps.
        max_norm=1.0,
    ),
    "qwen2_tiny": dict(
        model_class=Qwen2ForCausalLM,
        config=lambda: Qwen2Config(
            vocab_size=80,
            hidden_size=32,
            intermediate_size=56,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_theta=1e6,
            rms_norm_eps=1e-6,
            use_sliding_window=False,
            max_position_embeddings=64,
        ),
        init_seed=5678,
        data_seed=8765,
        max_norm=1.0,
    ),
    # Per-head q/k RMSNorm, and head_dim 32 != hidden / heads = 12, so q_proj is
    # [128, 48] and o_proj [48, 128].
    "qwen3_tiny": dict(
        model_class=Qwen3ForCausalLM,
        config=lambda: Qwen3Config(
            vocab_size=128,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=False,
            rope_theta=1e6,
            rms_norm_eps=1e-6,
            attention_bias=False,
            use_sliding_window=False,
            max_position_embeddings=64,
        ),
        init_seed=9012,
        data_seed=2109,
        max_norm=1.0,
    ),
}


def head_dim_of(config):
    """The explicit head_dim (Qwen3, some Llama configs) or hidden / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_environment():
    major = int(transformers.__version__.split(".")[0])
    if major != 4:
        sys.exit(
            f"transformers {transformers.__version__}: need 4.x (see requirements.txt). "
            "transformers 5 writes rope_theta/rope_scaling as 'rope_parameters', unlike "
            "the published checkpoints the engine reads."
        )
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def init_weights(model, seed):
    """Large random weights so activations and gradients are far from zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + INIT_STD_NORM_NOISE * noise)
            elif name.endswith(".bias"):
                p.copy_(INIT_STD_BIAS * noise)
            else:
                assert p.dim() == 2, name
                p.copy_(INIT_STD_MATRIX * noise)


def check_config_json(path, config_class):
    with open(path) as f:
        text = f.read()
    print(text)
    saved = json.loads(text)
    standard = set(config_class().to_dict()) | {"architectures", "torch_dtype", "transformers_version"}
    unknown = sorted(set(saved) - standard)
    assert not unknown, f"non-standard keys in config.json: {unknown}"
    assert saved["torch_dtype"] == "float32", saved["torch_dtype"]
    return saved


def make_data(vocab, seed):
    """input_ids/targets [STEPS, MICRO_BATCHES, BATCH, SEQ]; targets aligned with inputs.

    targets[s, m, b, t] is the token the model must predict from position t (the
    next token of the stream), or IGNORE_INDEX. Masking mixes random holes
    (~12%), a masked prompt prefix, a masked padding tail and one fully masked row,
    so the two micro-batches of a step have different valid counts.
    """
    gen = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, vocab, (STEPS, MICRO_BATCHES, BATCH, SEQ + 1), generator=gen)
    input_ids = stream[..., :-1].clone()
    targets = stream[..., 1:].clone()
    holes = torch.rand((STEPS, MICRO_BATCHES, BATCH, SEQ), generator=gen) < 0.12
    targets[holes] = IGNORE_INDEX
    targets[0, 0, 0, :4] = IGNORE_INDEX  # prompt prefix
    targets[0, 1, 1, -5:] = IGNORE_INDEX  # padding tail
    targets[1, 1, 0, :7] = IGNORE_INDEX  # longer prompt prefix
    targets[2, 1, 1, :] = IGNORE_INDEX  # a row with no valid target at all
    valid = (targets != IGNORE_INDEX).sum(dim=(2, 3))  # [STEPS, MICRO_BATCHES]
    for s in range(STEPS):
        assert valid[s, 0] != valid[s, 1], f"step {s}: micro-batches have equal valid counts {valid[s]}"
        assert valid[s].sum() > 0
    masked_fraction = (targets == IGNORE_INDEX).double().mean().item()
    assert masked_fraction >= 0.10, masked_fraction
    return input_ids.to(torch.int32), targets.to(torch.int32), valid, masked_fraction


def param_groups(model):
    """AdamW groups: decay for 2-D weights, no decay for norms and biases (asserted by name)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert name.endswith(("_proj.weight", "embed_tokens.weight", "lm_head.weight")), name
            decay.append((name, p))
        else:
            assert p.dim() == 1 and name.endswith(("norm.weight", ".bias")), name
            no_decay.append((name, p))
    return decay, no_decay


def step_loss_and_backward(model, input_ids, targets, step):
    """Accumulates the gradient of one step; returns the loss (float64 tensor)."""
    total_valid = int((targets[step] != IGNORE_INDEX).sum())
    loss = torch.zeros((), dtype=torch.float64)  # the model's own dtype is used for the backward
    for micro in range(MICRO_BATCHES):
        logits = model(input_ids=input_ids[step, micro].long()).logits
        nll_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets[step, micro].reshape(-1).long(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        (nll_sum / total_valid).backward()
        loss += nll_sum.detach() / total_valid
    return loss


def step0_loss(model, input_ids, targets):
    """Loss of step 0 without backward (for the finite-difference check)."""
    total_valid = int((targets[0] != IGNORE_INDEX).sum())
    with torch.no_grad():
        total = 0.0
        for micro in range(MICRO_BATCHES):
            logits = model(input_ids=input_ids[0, micro].long()).logits
            total += F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                targets[0, micro].reshape(-1).long(),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            ).item()
    return total / total_valid


def check_gradient_by_finite_differences(model, input_ids, targets, grads):
    """Central differences on a few entries: the float64 autograd gradient is what we think."""
    params = dict(model.named_parameters())
    picks = [
        ("model.embed_tokens.weight", (int(input_ids[0, 0, 0, 3]), 5)),
        ("model.layers.0.self_attn.q_proj.weight", (7, 11)),
        ("model.layers.1.mlp.down_proj.weight", (3, 2)),
        ("model.layers.0.input_layernorm.weight", (4,)),
        ("model.norm.weight", (1,)),
    ]
    if "model.layers.0.self_attn.q_norm.weight" in grads:  # qwen3's per-head norms
        picks += [
            ("model.layers.0.self_attn.q_norm.weight", (5,)),
            ("model.layers.1.self_attn.k_norm.weight", (17,)),
        ]
    h = 1e-6
    for name, index in picks:
        p = params[name]
        with torch.no_grad():
            original = p[index].item()
            p[index] = original + h
            plus = step0_loss(model, input_ids, targets)
            p[index] = original - h
            minus = step0_loss(model, input_ids, targets)
            p[index] = original
        numeric = (plus - minus) / (2 * h)
        analytic = grads[name][index].item()
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (name, numeric, analytic)
        print(f"  finite difference {name}{list(index)}: {numeric:.10f} vs autograd {analytic:.10f}")


def train(model64, input_ids, targets, max_norm, check_step0_gradient=None):
    """The contract's 3 steps on `model64` (float64 for the reference; also reused in fp32).

    check_step0_gradient(model, grads) runs on the accumulated step-0 gradient before the clip.
    """
    decay, no_decay = param_groups(model64)
    names = [n for n, _ in decay] + [n for n, _ in no_decay]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for _, p in decay], "weight_decay": WEIGHT_DECAY},
            {"params": [p for _, p in no_decay], "weight_decay": 0.0},
        ],
        lr=LRS[0],
        betas=BETAS,
        eps=ADAM_EPS,
        amsgrad=False,
        maximize=False,
        foreach=False,
        fused=False,
    )
    assert [g["weight_decay"] for g in optimizer.param_groups] == [WEIGHT_DECAY, 0.0]
    params = [p for _, p in model64.named_parameters()]
    losses, grad_norms, clip_coefs, grad0 = [], [], [], None
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = step_loss_and_backward(model64, input_ids, targets, step)
        if step == 0:
            grad0 = {n: p.grad.detach().clone() for n, p in model64.named_parameters()}
            if check_step0_gradient:
                check_step0_gradient(model64, grad0)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0, foreach=False)
        coef = max_norm / (norm.item() + TORCH_CLIP_EPS)
        assert coef < 1.0, f"step {step}: clip inactive (norm {norm.item()} <= max_norm {max_norm})"
        for group in optimizer.param_groups:
            group["lr"] = LRS[step]
        optimizer.step()
        losses.append(loss.item())
        grad_norms.append(norm.item())
        clip_coefs.append(coef)
        if check_step0_gradient:
            print(f"  step {step}: loss {loss.item():.12f} grad_norm {norm.item():.12f} clip_coef {coef:.12f} lr {LRS[step]}")
    final = {n: p.detach().clone() for n, p in model64.named_parameters()}
    return names, [n for n, _ in no_decay], losses, grad_norms, clip_coefs, grad0, final


def check_gradient_against_independent_forward(model64, input_ids, targets, grad0, inv_freq64):
    """Step-0 loss and gradient from exact_fp64.reference_logits equal the patched HF ones."""
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model64.named_parameters()}
    total_valid = int((targets[0] != IGNORE_INDEX).sum())
    for micro in range(MICRO_BATCHES):
        logits = reference_logits(params, model64.config, input_ids[0, micro].long(), inv_freq64)
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets[0, micro].reshape(-1).long(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        (nll / total_valid).backward()
    worst = max(((params[n].grad - g).abs().max() / g.abs().max().clamp_min(1e-30)).item() for n, g in grad0.items())
    print(f"  independent forward: worst relative gradient difference {worst:.3e}")
    assert worst < 1e-10, worst


def generate(name, spec, out_root):
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    print(f"== {name} -> {out}")
    config = spec["config"]()
    model_class = spec["model_class"]
    torch.manual_seed(spec["init_seed"])
    model32 = model_class(config).to(torch.float32)
    init_weights(model32, spec["init_seed"])
    model32.save_pretrained(out, safe_serialization=True)
    # save_pretrained also writes generation settings; the engine needs none of them.
    generation_config = os.path.join(out, "generation_config.json")
    if os.path.exists(generation_config):
        os.remove(generation_config)
    saved_config = check_config_json(os.path.join(out, "config.json"), type(config))

    stored = safetensors.torch.load_file(os.path.join(out, "model.safetensors"))
    param_names = [n for n, _ in model32.named_parameters()]
    assert sorted(stored) == sorted(param_names), (sorted(stored), param_names)
    assert all(t.dtype == torch.float32 for t in stored.values())
    if config.tie_word_embeddings:
        assert "lm_head.weight" not in stored
        assert model32.lm_head.weight is model32.model.embed_tokens.weight

    head_dim = head_dim_of(config)
    inv_freq64, unscaled64 = rope_inverse_frequencies(head_dim, config.rope_theta, config.rope_scaling)
    if config.rope_scaling:
        changed = (inv_freq64 != unscaled64).sum().item()
        assert changed > 0, "llama3 rope warp leaves every frequency unchanged at this size"
        print(f"  llama3 warp changes {changed}/{len(inv_freq64)} frequencies: {unscaled64.tolist()} -> {inv_freq64.tolist()}")

    # The float64 reference is loaded back from the files just written, so it is
    # exact for the stored fp32 weights.
    model64 = model_class.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="sdpa").double()
    model64.train()  # no dropout in these configs (attention_dropout 0); train() for fidelity
    for n, p in model64.named_parameters():
        assert p.dtype == torch.float64 and torch.equal(p.float(), stored[n]), n
    if config.tie_word_embeddings:
        assert model64.lm_head.weight is model64.model.embed_tokens.weight
    stock64 = copy.deepcopy(model64)  # HF as shipped, with its float32 casts; only for the report
    make_hf_model_exact(model64, inv_freq64)

    input_ids, targets, valid, masked_fraction = make_data(config.vocab_size, spec["data_seed"])
    print(f"  valid targets per [step][micro]: {valid.tolist()}, masked fraction {masked_fraction:.3f}")

    with torch.no_grad():
        logits0 = model64(input_ids=input_ids[0, 0].long()).logits
        independent = reference_logits(
            dict(model64.named_parameters()), config, input_ids[0, 0].long(), inv_freq64
        )
        stock = stock64(input_ids=input_ids[0, 0].long()).logits
    independent_diff = (logits0 - independent).abs().max().item()
    stock_diff = (logits0 - stock).abs().max().item()
    print(f"  logits: patched HF fp64 vs independent fp64 {independent_diff:.3e}; vs stock HF .double() {stock_diff:.3e}")
    assert independent_diff < 1e-11, independent_diff

    # Sanity: transformers itself, in fp32 from the saved files, matches the reference.
    reloaded = model_class.from_pretrained(out)
    assert reloaded.dtype == torch.float32
    with torch.no_grad():
        logits32 = reloaded(input_ids=input_ids[0, 0].long()).logits
    fp32_diff = (logits32.double() - logits0).abs().max().item()
    print(f"  logits: HF fp32 (reloaded) vs fp64 reference max abs diff {fp32_diff:.3e}")
    assert fp32_diff <= 1e-4, fp32_diff

    def check_step0_gradient(model, grads):
        check_gradient_by_finite_differences(model, input_ids, targets, grads)
        check_gradient_against_independent_forward(model, input_ids, targets, grads, inv_freq64)

    names, no_decay_names, losses, grad_norms, clip_coefs, grad0, final = train(
        model64, input_ids, targets, spec["max_norm"], check_step0_gradient
    )
    moved = max((final[n] - stored[n].double()).abs().max().item() for n in names)
    print(f"  largest weight change over {STEPS} steps: {moved:.4f}")

    # How far ordinary fp32 training (HF as shipped, fp32 everywhere) lands from the
    # reference: a yardstick for the tolerances of an fp32 engine.
    _, _, losses32, norms32, _, grad32, final32 = train(reloaded, input_ids, targets, spec["max_norm"])
    fp32_training = {
        "loss_max_abs": max(abs(a - b) for a, b in zip(losses32, losses)),
        "grad_norm_max_rel": max(abs(a - b) / b for a, b in zip(norms32, grad_norms)),
        "step0_grad_max_abs": max((grad32[n].double() - grad0[n]).abs().max().item() for n in names),
        "step3_weights_max_abs": max((final32[n].double() - final[n]).abs().max().item() for n in names),
        # Adam turns near-zero gradients (e.g. Qwen2 k_proj.bias on low-frequency RoPE
        # pairs, analytically ~0) into lr-sized steps, so fp32 roundoff shows there most.
        "step3_weights_max_abs_by_tensor": {
            n: (final32[n].double() - final[n]).abs().max().item() for n in param_names
        },
    }
    summary = {k: v for k, v in fp32_training.items() if not k.endswith("by_tensor")}
    worst = max(fp32_training["step3_weights_max_abs_by_tensor"].items(), key=lambda kv: kv[1])
    print(f"  HF fp32 training vs reference: {summary}; worst step3 tensor {worst[0]}")

    tensors = {
        "input_ids": input_ids.contiguous(),
        "targets": targets.contiguous(),
        "logits_step0_micro0": logits0.float().contiguous(),
        "loss": torch.tensor(losses, dtype=torch.float64),
        "grad_norm": torch.tensor(grad_norms, dtype=torch.float64),
        "clip_coef": torch.tensor(clip_coefs, dtype=torch.float64),
        "lr": torch.tensor(LRS, dtype=torch.float64),
    }
    for n in param_names:
        tensors["grad." + n] = grad0[n].float().contiguous()
    for n in param_names:
        tensors["step3." + n] = final[n].float().contiguous()
    safetensors.torch.save_file(tensors, os.path.join(out, "golden.safetensors"), metadata={"format": "pt"})

    golden = {
        "fixture": name,
        "model_type": saved_config["model_type"],
        "steps": STEPS,
        "micro": MICRO_BATCHES,
        "batch": BATCH,
        "seq": SEQ,
        "shape_note": "input_ids/targets are [steps, micro, batch, seq]; micro = micro-batches accumulated per optimizer step, batch = rows per micro-batch",
        "ignore_index": IGNORE_INDEX,
        "targets_aligned": "targets[s,m,b,t] is the label for the logits at position t (already shifted; no further shift)",
        "attention_mask": "none: plain causal attention over all 19 positions, masked targets only drop out of the loss",
        "loss_definition": "per step: sum over both micro-batches of -log_softmax(logits)[target] over valid targets, divided by the step's total valid count",
        "valid_tokens": valid.tolist(),
        "masked_fraction": masked_fraction,
        "optimizer": "torch.optim.AdamW (single-tensor path), float64",
        "lr": LRS,
        "betas": list(BETAS),
        "eps": ADAM_EPS,
        "weight_decay": {"decay": WEIGHT_DECAY, "no_decay": 0.0},
        "decay_params": [n for n in names if n not in no_decay_names],
        "no_decay_params": no_decay_names,
        "max_norm": spec["max_norm"],
        "clip": "torch.nn.utils.clip_grad_norm_: grad_norm = L2 norm over all parameter gradients (tied embedding counted once); clip_coef = max_norm / (grad_norm + 1e-6), applied when < 1",
        "grad_norm": grad_norms,
        "clip_coef": clip_coefs,
        "loss": losses,
        "init": {
            "seed": spec["init_seed"],
            "matrix_std": INIT_STD_MATRIX,
            "norm": f"1 + N(0, {INIT_STD_NORM_NOISE}^2)",
            "bias_std": INIT_STD_BIAS,
        },
        "data_seed": spec["data_seed"],
        "rope_inv_freq_float64": inv_freq64.tolist(),
        "reference": "transformers model reloaded from model.safetensors, converted to float64, with RMSNorm and RoPE patched to float64 (exact_fp64.py), sdpa attention",
        "checks": {
            "hf_fp32_vs_reference_logits_max_abs": fp32_diff,
            "independent_fp64_vs_reference_logits_max_abs": independent_diff,
            "stock_hf_double_vs_reference_logits_max_abs": stock_diff,
            "hf_fp32_training_vs_reference": fp32_training,
        },
        "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)} for k, v in tensors.items()},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "numpy": numpy.__version__,
        },
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")

    for fname in ("config.json", "model.safetensors", "golden.safetensors", "golden.json"):
        print(f"  {fname}: {os.path.getsize(os.path.join(out, fname))} bytes")
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"  total: {total} bytes")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="output root")
    parser.add_argument("--only", choices=sorted(FIXTURES), help="generate one fixture")
    args = parser.parse_args()
    check_environment()
    for name, spec in FIXTURES.items():
        if args.only in (None, name):
            generate(name, spec, args.out)


if __name__ == "__main__":
    main()
