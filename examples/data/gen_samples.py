#!/usr/bin/env python3
"""Writes the small sample tensors of examples/data (python3 stdlib only).

    python3 examples/data/gen_samples.py [OUTDIR]

matrix.npy            float32 [4, 6], C order, element (r, c) = r * 6 + c
fortran.npy           float64 [3, 5], Fortran order, element (r, c) = r + c / 10
ints/counts.npy       int32 [10], 0..9 squared
flags.npy             bool [2, 3]
model.safetensors     embed.weight F32 [8, 4], lm_head.bias BF16 [8],
                      norm.scale F16 [4]

The same script always writes the same bytes, so the files can be checked
in and regenerated at will.
"""
import json
import os
import struct
import sys


def npy(path, descr, shape, fortran, payload):
    shape_s = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", shape_s)
    total = 10 + len(d) + 1
    pad = (64 - total % 64) % 64
    header = d + " " * pad + "\n"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)))
        f.write(header.encode("latin1"))
        f.write(payload)


def bf16(x):
    # Round to nearest even on the upper 16 bits of the float32.
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.pack("<H", (bits >> 16) & 0xFFFF)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    npy(os.path.join(out, "matrix.npy"), "<f4", (4, 6), False,
        b"".join(struct.pack("<f", r * 6 + c) for r in range(4) for c in range(6)))
    # Fortran order: column after column.
    npy(os.path.join(out, "fortran.npy"), "<f8", (3, 5), True,
        b"".join(struct.pack("<d", r + c / 10) for c in range(5) for r in range(3)))
    npy(os.path.join(out, "ints", "counts.npy"), "<i4", (10,), False,
        b"".join(struct.pack("<i", i * i) for i in range(10)))
    npy(os.path.join(out, "flags.npy"), "|b1", (2, 3), False, bytes([1, 0, 1, 0, 0, 1]))

    tensors = [
        ("embed.weight", "F32", [8, 4],
         b"".join(struct.pack("<f", (i - 16) / 8) for i in range(32))),
        ("lm_head.bias", "BF16", [8], b"".join(bf16(0.5 * i - 1) for i in range(8))),
        ("norm.scale", "F16", [4], b"".join(struct.pack("<e", 1 + i / 4) for i in range(4))),
    ]
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


if __name__ == "__main__":
    main()
