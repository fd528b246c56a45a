#!/usr/bin/env python3
"""Checks a .safetensors file against the format (https://github.com/huggingface/safetensors),
independently of ctitan's writer (checkpointd/safetensors.c); tests/test_ckpt_tool runs it on exports.

    tools/check_safetensors.py FILE

Prints the __metadata__ entries, one "NAME DTYPE [SHAPE]" line per tensor in data order and a
summary; exits 1 at the first violation (with what is wrong), 2 on bad usage. Standard library
only. When the `safetensors` and `numpy` packages are importable it also loads the file with
safetensors.numpy.load_file and checks that it gives the same tensors, shapes and bytes.
ctitan's own rule, checked too: the data starts at a multiple of 8 bytes."""
import json
import os
import struct
import sys

# bytes per element of every dtype the format defines
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
MAX_HEADER = 100_000_000  # the reference reader refuses larger headers


class Bad(Exception):
    pass


def no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise Bad(f"duplicate key {k!r} in the header")
        d[k] = v
    return d


def is_uint(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        first = f.read(8)
        if len(first) < 8:
            raise Bad(f"{size} bytes: too short for the 8-byte header size")
        (n,) = struct.unpack("<Q", first)
        if n > MAX_HEADER:
            raise Bad(f"header size {n} exceeds {MAX_HEADER}")
        if 8 + n > size:
            raise Bad(f"header size {n} runs past the end of the {size}-byte file")
        if (8 + n) % 8:
            raise Bad(f"data starts at byte {8 + n}, not a multiple of 8")
        raw = f.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Bad(f"header is not UTF-8: {e}")
    if not text.startswith("{"):
        raise Bad("header does not start with '{'")
    try:
        hdr, end = json.JSONDecoder(object_pairs_hook=no_duplicates).raw_decode(text)
    except json.JSONDecodeError as e:
        raise Bad(f"header is not JSON: {e}")
    if text[end:].strip(" "):
        raise Bad(f"header has {text[end:]!r} after the JSON (only spaces may pad it)")
    if not isinstance(hdr, dict):
        raise Bad("header is not a JSON object")

    meta = hdr.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise Bad("__metadata__ must map strings to strings")

    buffer = size - 8 - n
    tensors = []
    for name, t in hdr.items():
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            raise Bad(f"tensor {name!r}: wants exactly dtype, shape and data_offsets, has {t!r}")
        dtype, shape, offs = t["dtype"], t["shape"], t["data_offsets"]
        if dtype not in DTYPE_SIZES:
            raise Bad(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(is_uint(d) for d in shape):
            raise Bad(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offs, list) and len(offs) == 2 and all(is_uint(o) for o in offs)):
            raise Bad(f"tensor {name!r}: data_offsets {offs!r} is not [begin, end]")
        numel = 1
        for d in shape:
            numel *= d
        if offs[1] < offs[0] or offs[1] - offs[0] != numel * DTYPE_SIZES[dtype]:
            raise Bad(f"tensor {name!r}: data_offsets {offs} hold {offs[1] - offs[0]} bytes, "
                      f"{dtype} {shape} needs {numel * DTYPE_SIZES[dtype]}")
        tensors.append((offs[0], offs[1], name, dtype, shape))

    # the byte buffer is covered exactly: no gaps, no overlaps, nothing after the last tensor
    tensors.sort()
    pos = 0
    for b, e, name, _, _ in tensors:
        if b != pos:
            raise Bad(f"tensor {name!r} starts at {b}, the previous one ended at {pos} "
                      f"({'gap' if b > pos else 'overlap'})")
        pos = e
    if pos != buffer:
        raise Bad(f"tensors cover {pos} bytes, the data after the header is {buffer}")
    return n, meta or {}, tensors


def compare_with_library(path, n, tensors):
    """The reference reader, when installed, must agree byte for byte."""
    try:
        import numpy  # noqa: F401
        from safetensors.numpy import load_file
    except ImportError:
        print("safetensors package not importable: reference load skipped")
        return
    loaded = load_file(path)
    if set(loaded) != {t[2] for t in tensors}:
        raise Bad("safetensors.numpy.load_file gives other tensor names")
    with open(path, "rb") as f:
        for b, e, name, _, shape in tensors:
            f.seek(8 + n + b)
            if list(loaded[name].shape) != shape or loaded[name].tobytes() != f.read(e - b):
                raise Bad(f"tensor {name!r}: safetensors.numpy.load_file gives other shape or bytes")
    print(f"safetensors.numpy.load_file agrees on all {len(tensors)} tensors")


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stdout if len(argv) == 2 else sys.stderr)
        return 0 if len(argv) == 2 else 2
    path = argv[1]
    try:
        n, meta, tensors = check(path)
        for k, v in meta.items():
            short = v if len(v) <= 60 and "\n" not in v else v[:60].split("\n")[0] + " ..."
            print(f"metadata {k}: {short}")
        for _, _, name, dtype, shape in tensors:
            print(f"{name} {dtype} {shape}")
        compare_with_library(path, n, tensors)
    except (Bad, OSError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    print(f"{path}: OK: {len(tensors)} tensors, {os.path.getsize(path) - 8 - n} bytes of data")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
