"""FLOP counts of one decoder layer and of a training step, from a Hugging Face config.json.

Shared by trace_summary.py (our measured spans) and torch_layer_peer.py (the torch peer), so
both divide by the same numbers. Matmuls only (norms, RoPE, SwiGLU and softmax are ignored);
causal attention counts the half of QK^T and PV it needs.
"""
import json


def load(path):
    with open(path) as f:
        c = json.load(f)
    heads = c["num_attention_heads"]
    d = c["hidden_size"]
    return {
        "hidden": d,
        "ffn": c["intermediate_size"],
        "layers": c["num_hidden_layers"],
        "heads": heads,
        "kv_heads": c.get("num_key_value_heads", heads),
        "head_dim": c.get("head_dim") or d // heads,
        "vocab": c["vocab_size"],
    }


def layer_linear_params(m):
    d, hd = m["hidden"], m["head_dim"]
    q = m["heads"] * hd
    kv = m["kv_heads"] * hd
    return d * q + 2 * d * kv + q * d + 3 * d * m["ffn"]


def attention_flops(m, batch, seq):
    """QK^T and PV of one layer's forward, causal: 2 matmuls x 2 flops x b h s^2 hd / 2."""
    return 2 * batch * m["heads"] * seq * seq * m["head_dim"]


def layer_forward_flops(m, batch, seq):
    return 2 * layer_linear_params(m) * batch * seq + attention_flops(m, batch, seq)


def model_step_flops(m, tokens_batch, seq):
    """6 P T over the layers and the LM head, plus causal attention forward and backward
    (no recompute counted: the model's FLOPs, not the executed ones)."""
    batch = tokens_batch // seq
    tokens = batch * seq
    p = layer_linear_params(m) * m["layers"] + m["hidden"] * m["vocab"]
    return 6 * p * tokens + 3 * attention_flops(m, batch, seq) * m["layers"]
