"""Summarises a train_local Chrome trace of a streamed step (run.sh's bench stages): per-layer
forward / backward / recompute compute time and TFLOP/s, per-layer copy-in and copy-out times,
each stream's busy and waiting share of the step, and the model TFLOP/s and MFU of that step.

Usage: trace_summary.py --trace T --config C --seq_len S --micro_batch B [--accumulation A]
                        [--peak_tflops 989]
The last line starts "summary: " (run.sh puts it in the stage's note).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layer_flops  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--seq_len", type=int, required=True)
    ap.add_argument("--micro_batch", type=int, required=True)
    ap.add_argument("--accumulation", type=int, default=1)
    # H100 SXM dense bf16 tensor-core peak (NVIDIA's datasheet, without sparsity).
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    a = ap.parse_args()
    m = layer_flops.load(a.config)
    with open(a.trace) as f:
        t = json.load(f)
    events = [e for e in (t["traceEvents"] if isinstance(t, dict) else t) if "dur" in e]
    if not events:
        sys.exit("trace_summary: no spans in " + a.trace)
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    step_s = (end - start) / 1e6

    def spans(stream, kind, prefix):
        return [e["dur"] / 1e3 for e in events
                if e.get("args", {}).get("stream") == stream and e.get("args", {}).get("kind") == kind
                and e["name"].startswith(prefix)]

    fwd_flops = layer_flops.layer_forward_flops(m, a.micro_batch, a.seq_len)
    print(f"trace {a.trace}: {len(events)} spans over {step_s * 1e3:.1f} ms (one step)")
    print(f"layer forward FLOPs {fwd_flops / 1e12:.3f} T (linear params "
          f"{layer_flops.layer_linear_params(m) / 1e6:.1f} M, micro-batch {a.micro_batch} x seq {a.seq_len})")
    rates = {}
    for name, prefix, mult in (("forward", "layer.fwd.", 1), ("backward", "layer.bwd.", 2),
                               ("recompute", "layer.recompute.", 1)):
        d = spans("compute", "compute", prefix)
        if d:
            med = statistics.median(d)
            rates[name] = mult * fwd_flops / (med / 1e3) / 1e12
            print(f"compute {name:9s}: {len(d):3d} spans, median {med:7.2f} ms, {rates[name]:6.1f} TFLOP/s")
    for stream, kind, prefix in (("copy_in", "copy_in", "layer."), ("copy_out", "copy_out", "layer.")):
        d = spans(stream, kind, prefix)
        if d:
            print(f"{stream:8s} per layer: {len(d):3d} spans, median {statistics.median(d):7.2f} ms")
    for stream in ("copy_in", "compute", "copy_out"):
        own = [e for e in events if e.get("args", {}).get("stream") == stream]
        busy = sum(e["dur"] for e in own if e["args"].get("kind") != "wait") / 1e6
        wait = sum(e["dur"] for e in own if e["args"].get("kind") == "wait") / 1e6
        print(f"stream {stream:8s}: busy {busy / step_s:6.1%}, waiting {wait / step_s:6.1%} of the step")
    compute_busy = sum(e["dur"] for e in events if e.get("args", {}).get("stream") == "compute"
                       and e["args"].get("kind") == "compute") / 1e6
    tokens = a.micro_batch * a.seq_len * a.accumulation
    model = layer_flops.model_step_flops(m, tokens, a.seq_len)
    tflops = model / step_s / 1e12
    print(f"summary: step {step_s:.3f} s, model {tflops:.1f} TFLOP/s = {tflops / a.peak_tflops:.1%} MFU "
          f"(6PT+attention over {tokens} tokens, peak {a.peak_tflops:g}), compute stream busy "
          f"{compute_busy / step_s:.1%}, layer fwd {rates.get('forward', 0):.0f} / bwd "
          f"{rates.get('backward', 0):.0f} TFLOP/s")


if __name__ == "__main__":
    main()
