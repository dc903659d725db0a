"""The MTSFT sample-set file (read by the engine's SFT reader): writer, streamed, and a reader.

    offset 0   8 bytes   magic: ASCII "MTSFT" then bytes 0x00 0x00 0x01
    offset 8   u64 LE    N = number of samples
    offset 16  u64 LE    T = total tokens
    offset 24  u32 LE    V = 1 + the largest token id in the file (0 when T = 0)
    offset 28  u32 LE    reserved, 0
    offset 32  u64 LE [N+1]  sample offsets into the token array: 0 = o[0] <= ... <= o[N] = T
    then       u32 LE [T]    token ids
    then       u8     [T]    loss mask: 1 = the loss term that predicts this token counts

The writer spools offsets, ids and masks to three temporary files beside the output (memory
stays flat however large the corpus), then assembles them into a temporary file created with
O_EXCL|O_NOFOLLOW, fsyncs it and renames it over the output, then fsyncs the directory: a reader
sees the old file or the whole new one. Abandoning the writer removes every temporary.
"""

import array
import os
import struct
import sys
import tempfile

MAGIC = b"MTSFT\x00\x00\x01"
HEADER = struct.Struct("<8sQQII")
_COPY_CHUNK = 1 << 20
assert sys.byteorder == "little"  # array('I'/'Q') are written in native order


class SampleSetWriter:
    def __init__(self, out_path):
        self._out = os.path.abspath(out_path)
        self._dir = os.path.dirname(self._out)
        self._spools = {}
        for name in ("offsets", "ids", "mask"):
            self._spools[name] = tempfile.TemporaryFile(dir=self._dir, prefix=".mtsft-spool-")
        self.samples = 0
        self.tokens = 0
        self.counted = 0
        self.max_id = -1
        self._spools["offsets"].write(struct.pack("<Q", 0))

    def add(self, ids, mask):
        if len(ids) != len(mask):
            raise ValueError("ids and mask differ in length")
        if ids:
            top = max(ids)
            if top >= 1 << 32 or min(ids) < 0:
                raise ValueError(f"token id {top} does not fit u32")
            self.max_id = max(self.max_id, top)
        self._spools["ids"].write(array.array("I", ids).tobytes())
        self._spools["mask"].write(bytes(mask))
        self.samples += 1
        self.tokens += len(ids)
        self.counted += sum(mask)
        self._spools["offsets"].write(struct.pack("<Q", self.tokens))

    def _copy(self, spool, out):
        spool.flush()
        spool.seek(0)
        while True:
            chunk = spool.read(_COPY_CHUNK)
            if not chunk:
                return
            out.write(chunk)

    def commit(self):
        vocab = self.max_id + 1 if self.tokens else 0
        header = HEADER.pack(MAGIC, self.samples, self.tokens, vocab, 0)
        tmp = None
        for attempt in range(100):
            candidate = f"{self._out}.tmp-{os.getpid()}-{attempt}"
            try:
                fd = os.open(candidate,
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644)
            except FileExistsError:
                continue
            tmp = candidate
            break
        if tmp is None:
            raise OSError(f"{self._out}: no free temporary name beside it")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(header)
                for name in ("offsets", "ids", "mask"):
                    self._copy(self._spools[name], out)
                out.flush()
                os.fsync(out.fileno())
            os.rename(tmp, self._out)
            tmp = None
            dir_fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        finally:
            if tmp is not None:
                os.unlink(tmp)
            self.close()

    def close(self):
        for spool in self._spools.values():
            spool.close()
        self._spools = {}


def read_sample_set(path):
    """The whole file as (vocab, [(ids, mask)]), checking every rule of the format (tests)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the header")
    magic, n, t, vocab, reserved = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ValueError(f"{path}: bad magic {magic!r}")
    if reserved != 0:
        raise ValueError(f"{path}: reserved field {reserved}")
    expected = HEADER.size + 8 * (n + 1) + 4 * t + t
    if len(data) != expected:
        raise ValueError(f"{path}: {len(data)} bytes, the header implies {expected}")
    offsets = struct.unpack_from(f"<{n + 1}Q", data, HEADER.size)
    if offsets[0] != 0 or offsets[-1] != t or any(a > b for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{path}: offsets not 0 = o[0] <= ... <= o[N] = T")
    ids_at = HEADER.size + 8 * (n + 1)
    ids = struct.unpack_from(f"<{t}I", data, ids_at)
    mask = data[ids_at + 4 * t:]
    if any(m > 1 for m in mask):
        raise ValueError(f"{path}: a mask byte other than 0 or 1")
    if vocab != (max(ids) + 1 if t else 0):
        raise ValueError(f"{path}: V={vocab}, but the largest id is {max(ids) if t else None}")
    samples = [(list(ids[a:b]), list(mask[a:b])) for a, b in zip(offsets, offsets[1:])]
    return vocab, samples
