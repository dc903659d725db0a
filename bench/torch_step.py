# torch_step.py: the PyTorch peer of step_bench — a plain fp32 Llama training step on the CPU,
# median tokens/s over warm steps, printed as one JSON line.
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, d, ffn, heads, kv_heads, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = Attention(d, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = Mlp(d, ffn)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList(
            Block(a.hidden, a.ffn, a.heads, a.kv_heads, 1e-5) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, 1e-5)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        self.checkpoint_every = a.checkpoint_every
        cos, sin = rope_tables(a.seq, a.hidden // a.heads, 10000.0)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def _run_blocks(self, first, last, x):
        for block in self.layers[first:last]:
            x = block(x, self.cos, self.sin)
        return x

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        n = len(self.layers)
        step = self.checkpoint_every if self.checkpoint_every > 0 else n
        for first in range(0, n, step):
            last = min(first + step, n)
            if self.checkpoint_every > 0:
                x = checkpoint(self._run_blocks, first, last, x, use_reentrant=False)
            else:
                x = self._run_blocks(first, last, x)
        return self.lm_head(self.norm(x))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1376)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--checkpoint-every", type=int, default=0, help="0 = no checkpointing")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Llama(a)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    # Same hyperparameters as step_bench's TrainerOptions (constant lr 3e-4).
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, a.vocab, (a.micro_batch, a.seq))
    targets = torch.randint(0, a.vocab, (a.micro_batch, a.seq))

    times = []
    loss = None
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(seconds)
    step_s = statistics.median(times)
    n_tokens = a.micro_batch * a.seq
    print(json.dumps({
        "bench": "torch_step",
        "config": {"hidden": a.hidden, "layers": a.layers, "ffn": a.ffn, "heads": a.heads,
                   "kv_heads": a.kv_heads, "vocab": a.vocab, "seq": a.seq,
                   "micro_batch": a.micro_batch, "checkpoint_every": a.checkpoint_every,
                   "threads": torch.get_num_threads(), "steps": a.steps, "warmup": a.warmup},
        "torch_version": torch.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "step_seconds": step_s,
        "tokens_per_second": n_tokens / step_s,
        "final_loss": loss.item(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
    }))


if __name__ == "__main__":
    main()
