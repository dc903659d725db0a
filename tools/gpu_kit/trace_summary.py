"""Summarises a train_local Chrome trace of a streamed step (run.sh's bench stages): per-layer
forward / backward / recompute compute time and TFLOP/s, per-layer copy-in and copy-out times,
each stream's busy and waiting share of the step, the compute stream's stall by cause, the
layer FLOPs executed against the 6PT model's (recompute overhead), the decoder weights moved
over the link as a multiple of their bf16 size, and the model TFLOP/s and MFU of that step.

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
    # Stall: the step's share in which the compute stream runs nothing, and what it waited on.
    waits = {}
    for e in events:
        if e.get("args", {}).get("stream") == "compute" and e["args"].get("kind") == "wait":
            waits[e["name"]] = waits.get(e["name"], 0.0) + e["dur"] / 1e6
    causes = ", ".join(f"{name} {sec * 1e3:.0f} ms" for name, sec in
                       sorted(waits.items(), key=lambda kv: -kv[1])) or "none"
    print(f"stall: compute stream idle {1 - compute_busy / step_s:.1%} of the step; "
          f"its waits: {causes}")
    # The rest of the idle time has no wait span: gaps between the compute stream's spans, where
    # the host thread that enqueues its work had not queued the next span yet (the end of a
    # micro-batch drains every stream; the host-side embedding gather; a host wait for an
    # update), grouped by what ends before and starts after them.
    gaps = {}
    ordered = sorted((e for e in events if e.get("args", {}).get("stream") == "compute"),
                     key=lambda e: e["ts"])
    covered_to, before = start, "step start"
    for e in ordered + [{"ts": end, "dur": 0, "name": "step end"}]:
        if e["ts"] > covered_to:
            key = f"{before} -> {e['name']}"
            total, count = gaps.get(key, (0.0, 0))
            gaps[key] = (total + (e["ts"] - covered_to) / 1e6, count + 1)
        if e["ts"] + e["dur"] >= covered_to:
            covered_to, before = e["ts"] + e["dur"], e["name"]
    gap_total = sum(total for total, _ in gaps.values())
    largest = sorted(gaps.items(), key=lambda kv: -kv[1][0])[:3]
    print(f"stall: gaps between compute spans {gap_total * 1e3:.0f} ms; largest: " +
          ("; ".join(f"{key} {total * 1e3:.0f} ms over {count}" for key, (total, count) in largest)
           or "none"))
    # A pass or a copy may be several spans of one name in a row (weights read from NVMe in
    # chunks, a fragmented layer's parts): count the runs, waits between them not breaking one.
    def passes(stream, kind, prefix):
        own = sorted((e for e in events if e.get("args", {}).get("stream") == stream
                      and e["args"].get("kind") == kind), key=lambda e: e["ts"])
        runs, previous = 0, None
        for e in own:
            if e["name"].startswith(prefix) and e["name"] != previous:
                runs += 1
            previous = e["name"]
        return runs

    # Recompute overhead: a layer pass forward costs F (its matmuls and attention), backward
    # 2F; the model counts one forward and one backward per layer and micro-batch (a backward
    # pass each), so executed / model = the layer passes run over 3F per backward pass.
    n_fwd = passes("compute", "compute", "layer.fwd.")
    n_bwd = passes("compute", "compute", "layer.bwd.")
    n_rec = passes("compute", "compute", "layer.recompute.")
    if n_bwd:
        print(f"layer passes executed / model (fwd + 2 bwd): "
              f"{(n_fwd + n_rec + 2 * n_bwd) / (3 * n_bwd):.3f} "
              f"({n_fwd} forward, {n_rec} recompute, {n_bwd} backward layer passes)")
    # Weights over the link: each layer copy-in (its spans in a row) moves one layer's weights.
    copies = {kind: passes("copy_in", "copy_in", "layer." + kind + ".")
              for kind in ("fwd", "bwd", "recompute")}
    n_copies = sum(copies.values())
    if n_copies and m["layers"]:
        per_step = n_copies / m["layers"]
        print(f"decoder weights over the link: {n_copies} layer copies ({copies['fwd']} forward, "
              f"{copies['bwd']} backward, {copies['recompute']} recompute) = {per_step:.2f}x "
              f"the decoder's bf16 size a step, {per_step / a.accumulation:.2f}x a micro-batch "
              f"({2 * layer_flops.layer_linear_params(m) * n_copies / 1e9:.1f} GB of linear weights)")
    tokens = a.micro_batch * a.seq_len * a.accumulation
    model = layer_flops.model_step_flops(m, tokens, a.seq_len)
    tflops = model / step_s / 1e12
    print(f"summary: step {step_s:.3f} s, model {tflops:.1f} TFLOP/s = {tflops / a.peak_tflops:.1%} MFU "
          f"(6PT+attention over {tokens} tokens, peak {a.peak_tflops:g}), compute stream busy "
          f"{compute_busy / step_s:.1%}, layer fwd {rates.get('forward', 0):.0f} / bwd "
          f"{rates.get('backward', 0):.0f} TFLOP/s")


if __name__ == "__main__":
    main()
