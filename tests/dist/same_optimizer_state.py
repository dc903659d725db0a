#!/usr/bin/env python3
"""Whether two checkpoints hold the same optimizer state, tensor by tensor and byte for byte,
whatever its files: optimizer.safetensors (one process, replicated ranks) or the
optimizer-rank-R-of-W.safetensors shards of ZeRO-1 ranks (docs/scale_out.md). Each tensor must
appear exactly once per checkpoint. Exits 0 when equal, 1 naming the first difference.

    same_optimizer_state.py CHECKPOINT_A CHECKPOINT_B
"""
import glob
import json
import os
import struct
import sys


def tensors(checkpoint):
    """Every tensor of the checkpoint's optimizer files: name -> (dtype, shape, bytes)."""
    files = sorted(glob.glob(os.path.join(checkpoint, "optimizer-rank-*-of-*.safetensors")))
    single = os.path.join(checkpoint, "optimizer.safetensors")
    if os.path.exists(single):
        files.append(single)
    if not files:
        sys.exit(f"FAIL: {checkpoint} has no optimizer file")
    found = {}
    for path in files:
        with open(path, "rb") as f:
            (header_size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_size))
            data = f.read()
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in found:
                sys.exit(f"FAIL: {checkpoint}: {name} is in more than one optimizer file")
            begin, end = info["data_offsets"]
            found[name] = (info["dtype"], info["shape"], data[begin:end])
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    if sorted(a) != sorted(b):
        sys.exit(f"FAIL: the tensors differ: only in A {sorted(set(a) - set(b))[:5]}, "
                 f"only in B {sorted(set(b) - set(a))[:5]}")
    for name in sorted(a):
        if a[name] != b[name]:
            sys.exit(f"FAIL: optimizer tensor {name} differs")
    print(f"optimizer state equal bit for bit: {len(a)} tensors")


if __name__ == "__main__":
    main()
