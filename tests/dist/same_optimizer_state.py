#!/usr/bin/env python3
"""Whether two checkpoints hold the same optimizer state, tensor by tensor and byte for byte,
whatever its files: optimizer.safetensors (one process, replicated ranks) or the
optimizer-rank-R-of-W.safetensors shards of ZeRO-1 ranks (docs/scale_out.md), where a tensor a
shard's range cuts is in pieces "NAME[begin:end]" (elements of the flattened tensor), put back
together here. Each element must appear exactly once per checkpoint. Exits 0 when equal, 1
naming the first difference.

    same_optimizer_state.py CHECKPOINT_A CHECKPOINT_B
"""
import glob
import json
import os
import re
import struct
import sys

PIECE = re.compile(r"^(.*)\[(\d+):(\d+)\]$")
ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2}


def tensors(checkpoint):
    """Every tensor of the checkpoint's optimizer files: name -> (dtype, shape, bytes)."""
    files = sorted(glob.glob(os.path.join(checkpoint, "optimizer-rank-*-of-*.safetensors")))
    single = os.path.join(checkpoint, "optimizer.safetensors")
    if os.path.exists(single):
        files.append(single)
    if not files:
        sys.exit(f"FAIL: {checkpoint} has no optimizer file")
    found = {}
    pieces = {}  # name -> [(begin, end, dtype, bytes)]
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
            piece = PIECE.match(name)
            if piece:
                pieces.setdefault(piece.group(1), []).append(
                    (int(piece.group(2)), int(piece.group(3)), info["dtype"], data[begin:end]))
            else:
                found[name] = (info["dtype"], info["shape"], data[begin:end])
    for name, parts in pieces.items():
        if name in found:
            sys.exit(f"FAIL: {checkpoint}: {name} is both whole and in pieces")
        parts.sort()
        covered, blob = 0, b""
        for begin, end, dtype, raw in parts:
            if begin != covered or len(raw) != (end - begin) * ELEMENT_BYTES[dtype]:
                sys.exit(f"FAIL: {checkpoint}: {name}[{begin}:{end}] does not continue at {covered}")
            covered, blob = end, blob + raw
        # The whole tensor's shape is the model's; pieces compare by dtype and bytes.
        found[name] = (parts[0][2], None, blob)
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    if sorted(a) != sorted(b):
        sys.exit(f"FAIL: the tensors differ: only in A {sorted(set(a) - set(b))[:5]}, "
                 f"only in B {sorted(set(b) - set(a))[:5]}")
    for name in sorted(a):
        (dtype_a, shape_a, bytes_a), (dtype_b, shape_b, bytes_b) = a[name], b[name]
        same_shape = shape_a is None or shape_b is None or shape_a == shape_b
        if dtype_a != dtype_b or not same_shape or bytes_a != bytes_b:
            sys.exit(f"FAIL: optimizer tensor {name} differs")
    print(f"optimizer state equal bit for bit: {len(a)} tensors")


if __name__ == "__main__":
    main()
