"""The torch peer for one decoder layer (issue 20 point 2): PyTorch on the same GPU runs the
same layer shape as our kit's 7B step (bf16 weights and activations, RMSNorm, q/k/v with bias,
RoPE, causal GQA attention through F.scaled_dot_product_attention, SwiGLU MLP), eager, and
prints forward and forward+backward TFLOP/s with layer_flops.py's counts, the ones
trace_summary.py divides our spans by.

Usage: torch_layer_peer.py --config C --shape BxS [--shape BxS ...] [--iters 10]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layer_flops  # noqa: E402


def make_layer(m, device):
    d, hd, h, kv, ffn = m["hidden"], m["head_dim"], m["heads"], m["kv_heads"], m["ffn"]

    def w(*shape):
        return (torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02).requires_grad_()

    p = {
        "n1": torch.ones(d, device=device, dtype=torch.bfloat16, requires_grad=True),
        "n2": torch.ones(d, device=device, dtype=torch.bfloat16, requires_grad=True),
        "q": w(h * hd, d), "qb": w(h * hd), "k": w(kv * hd, d), "kb": w(kv * hd),
        "v": w(kv * hd, d), "vb": w(kv * hd), "o": w(d, h * hd),
        "gate": w(ffn, d), "up": w(ffn, d), "down": w(d, ffn),
    }
    return p


def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def layer(p, m, x, cos, sin):
    b, s, d = x.shape
    h, kv, hd = m["heads"], m["kv_heads"], m["head_dim"]
    y = F.rms_norm(x, (d,), p["n1"], 1e-6)
    q = F.linear(y, p["q"], p["qb"]).view(b, s, h, hd).transpose(1, 2)
    k = F.linear(y, p["k"], p["kb"]).view(b, s, kv, hd).transpose(1, 2)
    v = F.linear(y, p["v"], p["vb"]).view(b, s, kv, hd).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(a.transpose(1, 2).reshape(b, s, h * hd), p["o"])
    y = F.rms_norm(x, (d,), p["n2"], 1e-6)
    return x + F.linear(F.silu(F.linear(y, p["gate"])) * F.linear(y, p["up"]), p["down"])


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--shape", action="append", required=True, help="BATCHxSEQ")
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    m = layer_flops.load(a.config)
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    p = make_layer(m, dev)
    for shape in a.shape:
        b, s = (int(v) for v in shape.split("x"))
        x = torch.randn(b, s, m["hidden"], device=dev, dtype=torch.bfloat16, requires_grad=True)
        inv = 1.0 / (1e6 ** (torch.arange(0, m["head_dim"], 2, device=dev).float() / m["head_dim"]))
        ang = torch.outer(torch.arange(s, device=dev).float(), inv)
        cos = torch.cat((ang.cos(), ang.cos()), -1).to(torch.bfloat16)
        sin = torch.cat((ang.sin(), ang.sin()), -1).to(torch.bfloat16)
        dy = torch.randn_like(x)
        flops = layer_flops.layer_forward_flops(m, b, s)

        def fwd():
            layer(p, m, x, cos, sin)

        def fwd_bwd():
            layer(p, m, x, cos, sin).backward(dy)

        t_f = timed(fwd, a.iters)
        t_fb = timed(fwd_bwd, a.iters)
        print(f"torch_peer: b {b} seq {s}: forward {t_f * 1e3:.2f} ms = {flops / t_f / 1e12:.1f} "
              f"TFLOP/s; forward+backward {t_fb * 1e3:.2f} ms = {3 * flops / t_fb / 1e12:.1f} TFLOP/s; "
              f"backward alone ~{(t_fb - t_f) * 1e3:.2f} ms = {2 * flops / (t_fb - t_f) / 1e12:.1f} TFLOP/s")
        del x, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
