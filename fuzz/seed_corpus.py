#!/usr/bin/env python3
"""Seeds the libFuzzer corpora from the wire-v1 test vectors.

    seed_corpus.py VECTORS_DIR OUT_DIR

writes OUT_DIR/codec/ (one file per message of every vector: the input of
fuzz_codec) and OUT_DIR/reader/ (one file per vector: the whole byte stream
behind the fuzz_reader prefix, set up like the vector's sequence).  Only the
Python standard library is used.  Exits 1 when the folder holds no vectors.
"""
import glob
import json
import os
import struct
import sys

# fuzz_reader.c's mode bits.
MODE_C2S, MODE_LOCAL, MODE_STRICT = 1, 2, 64
REQ_SHIFT = 3  # request flags bits 0-2 go to mode bits 3-5
REQ_REGION = 4


def split(data):
    """Cuts back-to-back messages at their headers."""
    msgs, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<I", data, pos + 8)
        end = pos + 12 + length
        if end > len(data):
            break
        msgs.append(data[pos:end])
        pos = end
    if pos != len(data):
        msgs.append(data[pos:])
    return msgs


def reader_prefix(vector, msgs):
    """The fuzz_reader header reproducing the vector's receiving side."""
    seq = vector.get("sequence") or {}
    mode = MODE_STRICT
    if vector.get("transport") == "local":
        mode |= MODE_LOCAL
    if seq.get("direction") == "c2s":
        mode |= MODE_C2S
    req = seq.get("request") or {}
    flags = int(req.get("request_flags", 0)) & 7
    mode |= flags << REQ_SHIFT
    max_shards = min(int(req.get("max_shards", 1)), 255)
    if "base_stream" in seq:
        base = int(seq["base_stream"])
    elif seq.get("direction") == "c2s":
        base = 0
    elif msgs and len(msgs[0]) >= 12:
        base = struct.unpack_from("<I", msgs[0], 4)[0]
    else:
        base = 1
    out = bytearray([mode, max_shards, min(base, 255)])
    if flags & REQ_REGION:
        region = req.get("region") or {}
        offs = [int(x) for x in region.get("offset", [])]
        shape = [int(x) for x in region.get("shape", [])]
        rank = min(len(offs), 4)
        out.append(rank)
        for i in range(rank):
            out += bytes([min(offs[i], 255), min(shape[i], 255)])
    out.append(0)  # no chunk sizes: the fuzzer mutates them in
    return bytes(out)


def main():
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    vectors_dir, out_dir = sys.argv[1], sys.argv[2]
    codec_dir = os.path.join(out_dir, "codec")
    reader_dir = os.path.join(out_dir, "reader")
    os.makedirs(codec_dir, exist_ok=True)
    os.makedirs(reader_dir, exist_ok=True)
    files = sorted(glob.glob(os.path.join(vectors_dir, "*.json")))
    n_codec = n_reader = 0
    for path in files:
        topic = os.path.splitext(os.path.basename(path))[0]
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        for vector in doc.get("vectors", []):
            data = bytes.fromhex(vector["hex"])
            msgs = split(data)
            name = "%s-%s" % (topic, vector["name"])
            for i, msg in enumerate(msgs):
                with open(os.path.join(codec_dir, "%s-%d" % (name, i)),
                          "wb") as f:
                    f.write(msg)
                n_codec += 1
            with open(os.path.join(reader_dir, name), "wb") as f:
                f.write(reader_prefix(vector, msgs) + data)
            n_reader += 1
    print("seeded %d codec and %d reader inputs from %d files in %s"
          % (n_codec, n_reader, len(files), vectors_dir))
    return 0 if files else 1


if __name__ == "__main__":
    sys.exit(main())
