# peer_adamw.py: the host-AdamW peers of adamw_bench (DeepSpeedCPUAdam, torch.optim.AdamW foreach
# and fused) timed on one parameter count; one JSON line per optimizer.
import argparse
import json
import statistics
import sys
import time

import torch

# Same shape as adamw_bench: one packed "layer" = a decayed matrix plus a small undecayed norm.
NORM_ELEMENTS = 4096
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.95), 1e-8, 0.1


def make_groups(n):
    norm = min(n, NORM_ELEMENTS)
    sizes = [(n - norm, WEIGHT_DECAY), (norm, 0.0)]
    groups = []
    for size, decay in sizes:
        index = torch.arange(size, dtype=torch.float32)
        p = torch.nn.Parameter(0.01 * torch.remainder(index, 1013) - 5.0)
        p.grad = 1e-3 * torch.remainder(index, 97) - 0.05
        groups.append({"params": [p], "weight_decay": decay})
    return groups


def make_optimizer(kind, groups):
    if kind == "deepspeed_cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(groups, lr=LR, betas=BETAS, eps=EPS, adamw_mode=True)
    if kind == "torch_adamw_foreach":
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, foreach=True)
    if kind == "torch_adamw_fused":
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)
    raise ValueError(f"unknown optimizer kind {kind!r}")


def measure(kind, n, warmup, steps):
    groups = make_groups(n)
    try:
        optimizer = make_optimizer(kind, groups)
        optimizer.step()  # allocates m and v; not counted
    except Exception as error:  # a peer that cannot run here is reported, not fatal
        return {"optimizer": kind, "params": n, "error": f"{type(error).__name__}: {error}"}
    # Wall time, and the CPU time of the whole process (all threads) over the same step: on a shared
    # machine wall time mostly measures the CPU share we got (adamw_bench prints both too).
    seconds, cpu_seconds = [], []
    for step in range(warmup + steps):
        cpu_start = time.process_time()
        start = time.perf_counter()
        optimizer.step()
        elapsed = time.perf_counter() - start
        cpu_elapsed = time.process_time() - cpu_start
        if step >= warmup:
            seconds.append(elapsed)
            cpu_seconds.append(cpu_elapsed)
    median = statistics.median(seconds)
    return {"optimizer": kind, "params": n, "median_seconds": median, "best_seconds": min(seconds),
            "median_cpu_seconds": statistics.median(cpu_seconds),
            "params_per_second": n / median, "steps": steps, "warmup": warmup}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--optimizers", default="deepspeed_cpu_adam,torch_adamw_foreach,torch_adamw_fused")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for kind in args.optimizers.split(","):
        result = measure(kind, args.params, args.warmup, args.steps)
        result["torch"] = torch.__version__
        result["threads"] = torch.get_num_threads()
        print(json.dumps(result), flush=True)
        if "error" in result:
            print(f"peer_adamw: {kind}: {result['error']}", file=sys.stderr)


if __name__ == "__main__":
    main()
