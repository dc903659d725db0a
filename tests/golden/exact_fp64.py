# Exact float64 math for the golden generator: RoPE tables, HF patches, and an independent forward.
"""Float64 helpers for make_golden.py.

transformers 4.x hard-codes float32 in three places of the Llama/Qwen2/Qwen3 forward
even when the model is converted with .double(): RMSNorm upcasts to float32,
the rotary embedding computes cos/sin from a float32 inv_freq in float32, and
the eager attention runs its softmax in float32. A ".double()" HF model is
therefore NOT a float64 reference. This module

  * computes the RoPE inverse frequencies (with the "llama3" warp) in float64,
  * patches an HF model's RMSNorm and rotary modules to compute in the input
    dtype (the attention must be "sdpa", which has no hard-coded casts), and
  * implements the same decoder independently from HF's code, so the
    generator can prove the patched HF model is float64-exact: the two agree
    to ~1e-13, while any float32 leak would show as ~1e-7.
"""

import math
import types

import torch
import torch.nn.functional as F


def rope_inverse_frequencies(head_dim, theta, rope_scaling):
    """theta^(-2i/head_dim) for i < head_dim/2, then HF's "llama3" warp, in float64.

    Returns (warped, unscaled) as float64 tensors; warped == unscaled without scaling.
    """
    unscaled = [1.0 / theta ** ((2.0 * i) / head_dim) for i in range(head_dim // 2)]
    if not rope_scaling or rope_scaling.get("rope_type", "default") == "default":
        return torch.tensor(unscaled, dtype=torch.float64), torch.tensor(unscaled, dtype=torch.float64)
    assert rope_scaling["rope_type"] == "llama3", rope_scaling
    factor = rope_scaling["factor"]
    low = rope_scaling["low_freq_factor"]
    high = rope_scaling["high_freq_factor"]
    original = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen = original / low
    high_freq_wavelen = original / high
    warped = []
    for f in unscaled:
        wavelen = 2.0 * math.pi / f
        if wavelen < high_freq_wavelen:
            warped.append(f)
        elif wavelen > low_freq_wavelen:
            warped.append(f / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            warped.append((1.0 - smooth) * f / factor + smooth * f)
    return torch.tensor(warped, dtype=torch.float64), torch.tensor(unscaled, dtype=torch.float64)


def rope_cos_sin(inv_freq64, position_ids, dtype):
    """HF layout: angle[b, t, j] = pos * inv_freq[j % (D/2)], so cos/sin are [B, T, D]."""
    freqs = position_ids.to(torch.float64)[:, :, None] * inv_freq64[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class _ExactRotary(torch.nn.Module):
    """Drop-in for HF's Llama/Qwen2/Qwen3 RotaryEmbedding (forward(x, position_ids))."""

    def __init__(self, inv_freq64):
        super().__init__()
        self.inv_freq64 = inv_freq64.clone()

    def forward(self, x, position_ids):
        return rope_cos_sin(self.inv_freq64, position_ids, x.dtype)


def _exact_rms_norm_forward(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def make_hf_model_exact(model, inv_freq64):
    """Removes HF's float32 casts from `model` (a *ForCausalLM) in place."""
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    base = model.model
    assert abs(base.rotary_emb.attention_scaling - 1.0) == 0.0
    hf_inv_freq = base.rotary_emb.inv_freq.to(torch.float64)
    # HF's table is inv_freq rounded to float32 (plus float32 warp arithmetic).
    assert torch.allclose(hf_inv_freq, inv_freq64, rtol=1e-6, atol=0.0), (hf_inv_freq, inv_freq64)
    base.rotary_emb = _ExactRotary(inv_freq64)
    patched = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_exact_rms_norm_forward, module)
            patched += 1
    # Two per layer and the final norm; Qwen3 adds q_norm and k_norm per layer.
    per_layer = 4 if model.config.model_type == "qwen3" else 2
    assert patched == per_layer * model.config.num_hidden_layers + 1, patched
    return model


def reference_logits(params, config, input_ids, inv_freq64):
    """Independent decoder forward (not HF code) over HF-named tensors in `params`.

    config: a transformers config; input_ids: [B, T] int64. Returns [B, T, V] logits.
    """
    eps = config.rms_norm_eps
    n_heads = config.num_attention_heads
    n_kv = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    batch, seq = input_ids.shape

    def rms_norm(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def linear(x, prefix):
        bias = params.get(prefix + ".bias")
        return F.linear(x, params[prefix + ".weight"], bias)

    def rotate(x, cos, sin):  # x: [B, H, T, D]; rotate-half pairing i <-> i + D/2
        half = head_dim // 2
        x_lo, x_hi = x[..., :half], x[..., half:]
        rotated = torch.cat((-x_hi, x_lo), dim=-1)
        return x * cos[:, None] + rotated * sin[:, None]

    positions = torch.arange(seq)[None, :].expand(batch, seq)
    cos, sin = rope_cos_sin(inv_freq64, positions, torch.float64)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()

    h = params["model.embed_tokens.weight"][input_ids]
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}"
        x = rms_norm(h, params[p + ".input_layernorm.weight"])
        q = linear(x, p + ".self_attn.q_proj").view(batch, seq, n_heads, head_dim).transpose(1, 2)
        k = linear(x, p + ".self_attn.k_proj").view(batch, seq, n_kv, head_dim).transpose(1, 2)
        v = linear(x, p + ".self_attn.v_proj").view(batch, seq, n_kv, head_dim).transpose(1, 2)
        if p + ".self_attn.q_norm.weight" in params:  # Qwen3: RMSNorm of each head, before RoPE
            q = rms_norm(q, params[p + ".self_attn.q_norm.weight"])
            k = rms_norm(k, params[p + ".self_attn.k_norm.weight"])
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = n_heads // n_kv  # query head j uses kv head j // group
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
        scores = scores.masked_fill(~causal, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        attn = attn.transpose(1, 2).reshape(batch, seq, n_heads * head_dim)
        h = h + linear(attn, p + ".self_attn.o_proj")
        x = rms_norm(h, params[p + ".post_attention_layernorm.weight"])
        gate = linear(x, p + ".mlp.gate_proj")
        up = linear(x, p + ".mlp.up_proj")
        h = h + linear(F.silu(gate) * up, p + ".mlp.down_proj")
    h = rms_norm(h, params["model.norm.weight"])
    head = params.get("lm_head.weight", params["model.embed_tokens.weight"])
    return h @ head.t()
