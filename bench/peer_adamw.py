# peer_adamw.py: the host-AdamW peers of adamw_bench (DeepSpeedCPUAdam, torch.optim.AdamW foreach
# and fused) timed on one parameter count; one JSON line per optimizer. With --ours LIB
# (//bench:libmegatrain_adamw.so) it times our HostAdamw in this same process, alternating with the
# peer step by step, so both sides see the same machine state (memory bandwidth on a shared VM swings
# 2x from minute to minute; separate processes minutes apart cannot be compared at 500M).
import argparse
import ctypes
import gc
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


class Ours:
    """HostAdamw through libmegatrain_adamw.so, on arrays allocated as our store allocates them."""

    def __init__(self, lib_path, n, threads, copy):
        self.lib = ctypes.CDLL(lib_path)
        self.lib.megatrain_adamw_create.restype = ctypes.c_void_p
        self.lib.megatrain_adamw_create.argtypes = [ctypes.c_int]
        self.lib.megatrain_adamw_destroy.argtypes = [ctypes.c_void_p]
        self.lib.megatrain_adamw_alloc.restype = ctypes.c_void_p
        self.lib.megatrain_adamw_alloc.argtypes = [ctypes.c_size_t]
        self.lib.megatrain_adamw_free.argtypes = [ctypes.c_void_p]
        self.lib.megatrain_adamw_step.restype = ctypes.c_int
        self.lib.megatrain_adamw_step.argtypes = (
            [ctypes.c_void_p, ctypes.c_longlong] + [ctypes.c_double] * 5 + [ctypes.c_size_t] * 2
            + [ctypes.c_void_p] * 5)
        self.n = n
        self.handle = self.lib.megatrain_adamw_create(threads)
        self.arrays = []
        # Same values as make_groups: the decayed matrix then the norm, packed in one buffer.
        norm = min(n, NORM_ELEMENTS)
        self.param = self._array(torch.float32, lambda i: 0.01 * torch.remainder(i, 1013) - 5.0, norm)
        self.grad = self._array(torch.float32, lambda i: 1e-3 * torch.remainder(i, 97) - 0.05, norm)
        self.m = self._array(torch.float32, None, norm)
        self.v = self._array(torch.float32, None, norm)
        self.bf16 = self._array(torch.bfloat16, None, norm) if copy else None
        self.norm = norm
        self.t = 0

    def _array(self, dtype, fill, norm):
        size = torch.tensor([], dtype=dtype).element_size()
        address = self.lib.megatrain_adamw_alloc(self.n * size)
        if not address:
            raise MemoryError(f"megatrain_adamw_alloc({self.n * size}) failed")
        self.arrays.append(address)
        tensor = torch.frombuffer((ctypes.c_uint8 * (self.n * size)).from_address(address), dtype=dtype)
        if fill is None:
            tensor.zero_()
        else:  # per group, as make_groups indexes each group from 0
            for begin, end in ((0, self.n - norm), (self.n - norm, self.n)):
                tensor[begin:end].copy_(fill(torch.arange(end - begin, dtype=torch.float32)))
        return address

    def step(self):
        self.t += 1
        rc = self.lib.megatrain_adamw_step(self.handle, self.t, LR, BETAS[0], BETAS[1], EPS, WEIGHT_DECAY,
                                           self.n, self.norm, self.param, self.m, self.v, self.grad,
                                           self.bf16)
        if rc != 0:
            raise RuntimeError(f"megatrain_adamw_step returned {rc}")

    def close(self):
        for address in self.arrays:
            self.lib.megatrain_adamw_free(address)
        self.lib.megatrain_adamw_destroy(self.handle)


def anon_huge_pages_mib():
    """AnonHugePages of this process: how much of the arrays really sits on transparent huge pages."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return -1


def side_by_side(kind, n, warmup, steps, ours_lib, threads, copy):
    """Ours and the peer, one step each per round, the order swapped every round.

    copy: with a bf16 copy of the new parameters. Ours writes it inside its pass; DeepSpeedCPUAdam (0.19)
    and torch.optim.AdamW cannot, so their side is their step followed by the copy_ that ZeRO-3's optimizer
    runs after each sub-group's step when parameters are offloaded to the CPU
    (fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)).
    """
    groups = make_groups(n)
    try:
        optimizer = make_optimizer(kind, groups)
        optimizer.step()  # allocates m and v; not counted
    except Exception as error:
        return {"optimizer": kind, "params": n, "error": f"{type(error).__name__}: {error}"}
    copies = [torch.zeros(g["params"][0].numel(), dtype=torch.bfloat16) for g in groups] if copy else []

    def peer_step():
        optimizer.step()
        for low, group in zip(copies, groups):
            low.copy_(group["params"][0].data)

    ours = Ours(ours_lib, n, threads, copy)
    ours.step()  # the peer's first step was not counted either
    sides = {"ours": ours.step, "peer": peer_step}
    seconds = {"ours": [], "peer": []}
    for round_index in range(warmup + steps):
        for side in (("ours", "peer") if round_index % 2 == 0 else ("peer", "ours")):
            start = time.perf_counter()
            sides[side]()
            elapsed = time.perf_counter() - start
            if round_index >= warmup:
                seconds[side].append(elapsed)
    huge_mib = anon_huge_pages_mib()  # ours advised, the peer's torch tensors not (THP = madvise)
    ours.close()
    del optimizer, groups, copies
    gc.collect()
    ratios = [p / o for p, o in zip(seconds["peer"], seconds["ours"])]
    return {"optimizer": kind, "params": n, "copy": "bf16" if copy else "none", "side_by_side": True,
            "ours_median_seconds": statistics.median(seconds["ours"]),
            "peer_median_seconds": statistics.median(seconds["peer"]),
            "ours_best_seconds": min(seconds["ours"]), "peer_best_seconds": min(seconds["peer"]),
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "ratios": [round(r, 3) for r in ratios], "anon_huge_pages_mib": huge_mib, "steps": steps,
            "warmup": warmup}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--optimizers", default="deepspeed_cpu_adam,torch_adamw_foreach,torch_adamw_fused")
    parser.add_argument("--ours", help="path of libmegatrain_adamw.so: time ours side by side with each peer")
    parser.add_argument("--copy", choices=["none", "bf16"], default="none",
                        help="with --ours: whether every side also writes a bf16 copy of the parameters")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for kind in args.optimizers.split(","):
        if args.ours:
            result = side_by_side(kind, args.params, args.warmup, args.steps, args.ours, args.threads,
                                  args.copy == "bf16")
        else:
            result = measure(kind, args.params, args.warmup, args.steps)
        result["torch"] = torch.__version__
        result["threads"] = torch.get_num_threads()
        print(json.dumps(result), flush=True)
        if "error" in result:
            print(f"peer_adamw: {kind}: {result['error']}", file=sys.stderr)


if __name__ == "__main__":
    main()
