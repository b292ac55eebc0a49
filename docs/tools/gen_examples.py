#!/usr/bin/env python3
"""Generates the annotated hex examples of docs/protocol.md (Hurray wire v1).

Standard library only.  The encoder below is a second, deliberately small
implementation of the wire tables: every field is emitted together with its
name, so the annotation cannot drift from the bytes.

Usage:
  gen_examples.py              write docs/examples/*.hex and refresh the
                               generated blocks of docs/protocol.md
  gen_examples.py --check      verify, change nothing: the encoder against
                               the shared test vectors, the examples against
                               the vectors they must equal, and that the .hex
                               files and docs/protocol.md are up to date
  gen_examples.py --print      print the rendered examples

Options: --vectors DIR (default: $HR_VECTORS, then <repo>/../shared/vectors,
then /work/shared/vectors).  Exit status 0 on success, 1 on any mismatch.

Format of the .hex files (and of the blocks in protocol.md): lines starting
with '#' are comments; every other line is "OOOO: HH HH ... ; field", where
OOOO is the hex offset of the line's first byte from the start of its message
(the 12-byte header included).  Everything after ';' is annotation.  A blank
line separates messages.  To recover the bytes, drop comments, the "OOOO:"
prefix and everything after ';', then read the hex pairs.
"""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
DOC = os.path.join(REPO, "docs", "protocol.md")
EXAMPLES = os.path.join(REPO, "docs", "examples")

MSG_NAMES = {
    0x01: "CLIENT_HELLO", 0x02: "SERVER_HELLO", 0x03: "TENSOR_REQUEST",
    0x04: "TENSOR_DESCRIPTOR", 0x05: "TENSOR_DATA", 0x06: "TENSOR_DATA_END",
    0x07: "TENSOR_PUT", 0x08: "TENSOR_PUT_ACK", 0x09: "ERROR",
    0x0A: "CANCEL", 0x0B: "GOAWAY", 0x0C: "RDMA_REGISTER",
    0x0D: "RDMA_READY", 0x0E: "PING", 0x0F: "PONG",
    0x10: "BUFFER_RELEASE", 0x11: "LIST_REQUEST", 0x12: "LIST_RESPONSE",
}
ELEM_NAMES = {
    0x00: "NONE", 0x01: "BOOL", 0x02: "INT8", 0x03: "UINT8", 0x04: "INT16",
    0x05: "UINT16", 0x06: "INT32", 0x07: "UINT32", 0x08: "INT64",
    0x09: "UINT64", 0x0A: "FLOAT16", 0x0B: "BFLOAT16", 0x0C: "FLOAT32",
    0x0D: "FLOAT64", 0x0E: "FLOAT8_E4M3FN", 0x0F: "FLOAT8_E5M2",
    0x10: "COMPLEX64", 0x11: "COMPLEX128", 0x12: "INT4", 0x13: "UINT4",
}
LAYOUT_NAMES = {
    0x01: "ROW_MAJOR", 0x02: "COLUMN_MAJOR", 0x03: "STRIDED",
    0x04: "PERMUTED", 0x05: "TILED", 0x06: "SPARSE_COO", 0x07: "SPARSE_CSR",
    0x08: "SPARSE_CSC", 0x09: "SPARSE_BSR", 0x0B: "COMPOSITE",
    0xF0: "PANEL", 0xF1: "TILED_EXACT", 0xF2: "PERMUTED_EXACT",
}
DEVICE_NAMES = {
    0x00: "CPU", 0x01: "CUDA", 0x02: "ROCM", 0x03: "METAL", 0x04: "VULKAN",
    0x05: "LEVEL_ZERO", 0x06: "OPENCL", 0x07: "WEBGPU", 0x08: "HEXAGON",
}
MEMCLASS_NAMES = {0x00: "STANDARD", 0x01: "PINNED", 0x02: "UNIFIED"}
SYNC_NAMES = {0x00: "SYNC_PRODUCER_SYNCED", 0x01: "SYNC_EVENT",
              0x02: "SYNC_CONSUMER_STREAM"}
CAP_NAMES = ["TRANSCODING", "PARALLEL_STREAMS", "RDMA_DATA_PLANE",
             "RDMA_GPUDIRECT", "TENSOR_PUT", "LIST", "SHM_DATA_PLANE",
             "REGION_REQUESTS"]
REQ_FLAG_NAMES = ["ALLOW_TRANSCODE", "PARALLEL_OK", "REGION"]
EXT_NAMES = {1: "AUTH_TOKEN", 2: "SESSION_JOIN", 3: "SESSION_TOKEN",
             4: "FABRIC_ADDRESS", 5: "PEER_NAME", 6: "MAX_SHARDS"}
DATA_PLANES = {0: "FRAMES", 1: "RDMA", 2: "SHM"}
MAGIC = 0x59525248

# ---------------------------------------------------------------------------
# Field-level encoder.  A "piece list" is a list of (bytes, label) tuples.
# ---------------------------------------------------------------------------


def u8(v, label):
    return [(struct.pack("<B", v), label)]


def u16(v, label):
    return [(struct.pack("<H", v), label)]


def u32(v, label):
    return [(struct.pack("<I", v), label)]


def u64(v, label):
    return [(struct.pack("<Q", v), label)]


def i64(v, label):
    return [(struct.pack("<q", v), label)]


def raw(b, label):
    return [(bytes(b), label)] if b else []


def str_(s, label):
    b = s.encode("utf-8")
    return u16(len(b), "%s: length %d" % (label, len(b))) + \
        raw(b, '%s = "%s"' % (label, s))


def bytes_(b, label):
    return u16(len(b), "%s: length %d" % (label, len(b))) + \
        raw(b, "%s" % label)


def flag_names(value, names):
    set_names = [n for i, n in enumerate(names) if value >> i & 1]
    return "|".join(set_names) if set_names else "none"


def layout_entry(entry, label):
    tag = entry["tag"]
    name = LAYOUT_NAMES.get(tag, "tag 0x%02X" % tag)
    out = u8(tag, "%s = 0x%02X %s" % (label, tag, name))
    if 0xF0 <= tag <= 0xFE:
        meta = bytes.fromhex(entry.get("ext_metadata", ""))
        out += u16(len(meta), "%s: ext_metadata_length %d" % (label, len(meta)))
        out += raw(meta, "%s: ext_metadata" % label)
    return out


def layout_list(entries, label):
    out = u16(len(entries), "%s: count %d" % (label, len(entries)))
    for i, e in enumerate(entries):
        out += layout_entry(e, "%s[%d]" % (label, i))
    return out


def u8_list(values, names, label):
    out = u16(len(values), "%s: count %d" % (label, len(values)))
    for i, v in enumerate(values):
        out += u8(v, "%s[%d] = 0x%02X %s" % (label, i, v, names.get(v, "")))
    return out


def extension(ext, label):
    t = ext["type"]
    data = bytes.fromhex(ext["data"])
    name = EXT_NAMES.get(t, "unknown")
    out = u16(t, "%s: type 0x%04X %s" % (label, t, name))
    out += u16(len(data), "%s: length %d" % (label, len(data)))
    if t == 6 and len(data) == 2:
        out += u16(struct.unpack("<H", data)[0],
                   "%s: MAX_SHARDS = %d" % (label, struct.unpack("<H", data)[0]))
    elif t == 5:
        out += raw(data, '%s: PEER_NAME = "%s"' % (label, data.decode("utf-8")))
    else:
        out += raw(data, "%s: data" % label)
    return out


def hello(p):
    out = u32(p["magic"], 'magic = 0x%08X ("HRRY")' % p["magic"])
    out += u16(p["version_major"], "version_major = %d" % p["version_major"])
    out += u16(p["version_minor"], "version_minor = %d" % p["version_minor"])
    caps = p["capability_flags"]
    out += u32(caps, "capability_flags = 0x%08X %s"
               % (caps, flag_names(caps, CAP_NAMES)))
    mms = p["max_message_size"]
    out += u32(mms, "max_message_size = %d" % mms)
    out += layout_list(p["supported_layouts"], "supported_layouts")
    out += u8_list(p["supported_devices"], DEVICE_NAMES, "supported_devices")
    out += u8_list(p["supported_memory_classes"], MEMCLASS_NAMES,
                   "supported_memory_classes")
    exts = p["extensions"]
    out += u16(len(exts), "extensions: count %d" % len(exts))
    for i, e in enumerate(exts):
        out += extension(e, "extensions[%d]" % i)
    return out


def request(p):
    out = str_(p["tensor_key"], "tensor_key")
    fl = p["request_flags"]
    out += u32(fl, "request_flags = 0x%08X %s" % (fl, flag_names(fl, REQ_FLAG_NAMES)))
    out += layout_list(p["preferred_layouts"], "preferred_layouts")
    dev = p["preferred_device"]
    out += u8(dev, "preferred_device = 0x%02X %s" % (dev, DEVICE_NAMES.get(dev, "")))
    al = p["min_alignment_log2"]
    out += u8(al, "min_alignment_log2 = %d (%d bytes)" % (al, 1 << al))
    out += u16(p["max_shards"], "max_shards = %d" % p["max_shards"])
    if fl & 4:
        reg = p["region"]
        n = len(reg["offset"])
        out += u8(n, "region rank = %d" % n)
        for i, v in enumerate(reg["offset"]):
            out += u64(v, "region_offset[%d] = %d" % (i, v))
        for i, v in enumerate(reg["shape"]):
            out += u64(v, "region_shape[%d] = %d" % (i, v))
    return out


def layout_params(tag, params, rank):
    """Encodes layout_params for the tags the examples and checks use."""
    out = []
    if tag == 3:
        out += u64(params["origin"], "  STRIDED origin = %d" % params["origin"])
        for i, s in enumerate(params["strides"]):
            out += i64(s, "  STRIDED strides[%d] = %d" % (i, s))
    elif tag == 4:
        for i, o in enumerate(params["order"]):
            out += u8(o, "  PERMUTED order[%d] = %d" % (i, o))
    elif tag == 5:
        for i, t in enumerate(params["tile"]):
            out += u32(t, "  TILED tile[%d] = %d" % (i, t))
    elif tag in (1, 2, 0xF0):
        pass
    else:
        raise ValueError("layout_params of tag 0x%02X not implemented" % tag)
    return out


def buffer_handle(b, i):
    lab = "buffer[%d]" % i
    out = u64(b["size_bytes"], "%s.size_bytes = %d" % (lab, b["size_bytes"]))
    al = b["alignment_log2"]
    out += u8(al, "%s.alignment_log2 = %d (%d bytes)" % (lab, al, 1 << al))
    dt = b["device_tag"]
    out += u8(dt, "%s.device_tag = 0x%02X %s" % (lab, dt, DEVICE_NAMES.get(dt, "")))
    mc = b["memory_class"]
    out += u8(mc, "%s.memory_class = 0x%02X %s" % (lab, mc, MEMCLASS_NAMES.get(mc, "")))
    out += u16(b["device_index"], "%s.device_index = %d" % (lab, b["device_index"]))
    sm = b["sync_mode"]
    out += u8(sm, "%s.sync_mode = 0x%02X %s" % (lab, sm, SYNC_NAMES.get(sm, "")))
    out += raw(b"\0\0", "%s.reserved" % lab)
    return out


def descriptor(d):
    rank = d["rank"]
    et = d["element_type"]
    out = u8(d["descriptor_version"], "descriptor_version = %d" % d["descriptor_version"])
    out += u8(et, "element_type = 0x%02X %s" % (et, ELEM_NAMES.get(et, "")))
    out += u8(rank, "rank = %d" % rank)
    fl = d["flags"]
    out += u8(fl, "flags = 0x%02X %s" % (fl, "HAS_SHARD" if fl & 1 else "none"))
    out += layout_entry(d["layout"], "layout")
    for i, s in enumerate(d["shape"]):
        out += u64(s, "shape[%d] = %d" % (i, s))
    params = layout_params(d["layout"]["tag"], d["layout_params"], rank)
    plen = sum(len(b) for b, _ in params)
    out += u16(plen, "layout_params: length %d" % plen) + params
    out += u64(d["byte_offset"], "byte_offset = %d" % d["byte_offset"])
    if fl & 1:
        for i, s in enumerate(d["parent_shape"]):
            out += u64(s, "parent_shape[%d] = %d" % (i, s))
        for i, s in enumerate(d["shard_offset"]):
            out += u64(s, "shard_offset[%d] = %d" % (i, s))
    out += u8(d["buffer_count"], "buffer_count = %d" % d["buffer_count"])
    for i, b in enumerate(d["buffers"]):
        out += buffer_handle(b, i)
    return out


def transport_fields(p):
    out = u64(p["total_data_bytes"], "total_data_bytes = %d" % p["total_data_bytes"])
    out += u16(p["shard_index"], "shard_index = %d" % p["shard_index"])
    out += u16(p["total_shards"], "total_shards = %d" % p["total_shards"])
    dp = p["data_plane"]
    out += u8(dp, "data_plane = %d %s" % (dp, DATA_PLANES.get(dp, "")))
    out += raw(b"\0\0\0", "reserved")
    return out


def tensor_descriptor(p):
    return descriptor(p["descriptor"]) + transport_fields(p)


def data(p, elem_fmt=None):
    out = u8(p["buffer_index"], "buffer_index = %d" % p["buffer_index"])
    out += raw(b"\0\0\0", "reserved")
    out += u64(p["byte_offset_in_buffer"],
               "byte_offset_in_buffer = %d" % p["byte_offset_in_buffer"])
    d = bytes.fromhex(p["data"])
    if elem_fmt:
        # One piece per element, so each gets its own annotation line.
        size = struct.calcsize(elem_fmt)
        first = p["byte_offset_in_buffer"] // size
        for k in range(len(d) // size):
            v = struct.unpack(elem_fmt, d[k * size:(k + 1) * size])[0]
            out += raw(d[k * size:(k + 1) * size],
                       "data: element %d = %r" % (first + k, v))
    else:
        out += raw(d, "data (%d bytes)" % len(d))
    return out


PAYLOAD_ENCODERS = {
    0x01: hello, 0x02: hello, 0x03: request, 0x04: tensor_descriptor,
    0x05: data, 0x06: lambda p: [], 0x08: lambda p: [], 0x0A: lambda p: [],
    0x0D: lambda p: [], 0x10: lambda p: [],
}


def message(mtype, stream_id, payload_pieces):
    plen = sum(len(b) for b, _ in payload_pieces)
    head = u32(mtype, "header: message_type = 0x%08X %s" % (mtype, MSG_NAMES[mtype]))
    head += u32(stream_id, "header: stream_id = %d" % stream_id)
    head += u32(plen, "header: payload_length = %d" % plen)
    return head + payload_pieces


def to_bytes(pieces):
    return b"".join(b for b, _ in pieces)


def encode_decoded(m):
    """Encodes a message from a vector's `decoded` object."""
    enc = PAYLOAD_ENCODERS[m["message_type"]]
    return to_bytes(message(m["message_type"], m["stream_id"], enc(m["payload"])))


# ---------------------------------------------------------------------------
# Rendering.
# ---------------------------------------------------------------------------


def render(pieces, title):
    """Renders one message: 8 bytes at most per line, labels after ';'."""
    lines = ["# " + title]
    off = 0
    for b, label in pieces:
        for k in range(0, len(b), 8):
            chunk = b[k:k + 8]
            hexs = " ".join("%02x" % c for c in chunk)
            lab = label if k == 0 else "  (continued)"
            lines.append("%04x: %-23s ; %s" % (off + k, hexs, lab))
        off += len(b)
    return "\n".join(lines)


def parse_hex_text(text):
    """Recovers the messages' bytes from rendered text (see module doc)."""
    msgs, cur = [], bytearray()
    for line in text.splitlines():
        s = line.strip()
        if not s:
            if cur:
                msgs.append(bytes(cur))
                cur = bytearray()
            continue
        if s.startswith("#"):
            continue
        s = s.split(";", 1)[0]
        s = s.split(":", 1)[1]
        cur += bytes.fromhex(s.replace(" ", ""))
    if cur:
        msgs.append(bytes(cur))
    return msgs


# ---------------------------------------------------------------------------
# The examples.
# ---------------------------------------------------------------------------

MIB = 1 << 20

CLIENT_HELLO = {
    "magic": MAGIC, "version_major": 1, "version_minor": 0,
    "capability_flags": 0,
    "max_message_size": 16 * MIB,
    "supported_layouts": [{"tag": 0x01}, {"tag": 0x02}],
    "supported_devices": [0x00],
    "supported_memory_classes": [0x00],
    "extensions": [],
}

SERVER_CAPS = (1 << 0) | (1 << 1) | (1 << 4) | (1 << 5) | (1 << 7)

SERVER_HELLO = {
    "magic": MAGIC, "version_major": 1, "version_minor": 0,
    "capability_flags": SERVER_CAPS,
    "max_message_size": 16 * MIB,
    "supported_layouts": [{"tag": t} for t in
                          (0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
                           0x09, 0x0B)] + [{"tag": 0xF0, "ext_metadata": ""}],
    "supported_devices": [0x00],
    "supported_memory_classes": [0x00],
    "extensions": [
        {"type": 6, "data": struct.pack("<H", 64).hex()},
        {"type": 5, "data": b"libhurray/0.1.0".hex()},
    ],
}

GET_REQUEST = {
    "tensor_key": "weights/layer0",
    "request_flags": 1,
    "preferred_layouts": [{"tag": 0x01}],
    "preferred_device": 0x00,
    "min_alignment_log2": 6,
    "max_shards": 1,
}

VALUES = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
TENSOR_BYTES = struct.pack("<6f", *VALUES)

GET_DESCRIPTOR = {
    "descriptor": {
        "descriptor_version": 1, "element_type": 0x0C, "rank": 2, "flags": 0,
        "layout": {"tag": 0x01}, "shape": [2, 3], "layout_params": {},
        "byte_offset": 0, "buffer_count": 1,
        "buffers": [{"size_bytes": 24, "alignment_log2": 6, "device_tag": 0,
                     "memory_class": 0, "device_index": 0, "sync_mode": 0}],
    },
    "total_data_bytes": 24, "shard_index": 0, "total_shards": 1,
    "data_plane": 0,
}


def frame(offset, length):
    return {"buffer_index": 0, "byte_offset_in_buffer": offset,
            "data": TENSOR_BYTES[offset:offset + length].hex()}


STREAM = 1

HELLO_MSGS = [
    (message(0x01, 0, hello(CLIENT_HELLO)), "client -> server"),
    (message(0x02, 0, hello(SERVER_HELLO)), "server -> client"),
]

GET_MSGS = [
    (message(0x03, STREAM, request(GET_REQUEST)), "client -> server"),
    (message(0x04, STREAM, tensor_descriptor(GET_DESCRIPTOR)), "server -> client"),
    (message(0x05, STREAM, data(frame(0, 24), "<f")), "server -> client"),
    (message(0x06, STREAM, []), "server -> client"),
]

GET_TWO_FRAMES_MSGS = [
    (message(0x05, STREAM, data(frame(0, 16), "<f")), "server -> client"),
    (message(0x05, STREAM, data(frame(16, 8), "<f")), "server -> client"),
]


def render_msgs(msgs):
    blocks = []
    for pieces, direction in msgs:
        mtype = struct.unpack_from("<I", to_bytes(pieces))[0]
        sid = struct.unpack_from("<I", to_bytes(pieces), 4)[0]
        total = len(to_bytes(pieces))
        title = "%s  (%s, stream %d, %d bytes = 12 header + %d payload)" % (
            MSG_NAMES[mtype], direction, sid, total, total - 12)
        blocks.append(render(pieces, title))
    return "\n\n".join(blocks)


def raw_hex(msgs):
    return "\n".join("# %s\n%s" % (
        MSG_NAMES[struct.unpack_from("<I", to_bytes(p))[0]], to_bytes(p).hex())
        for p, _ in msgs)


BLOCKS = {
    "hello": render_msgs(HELLO_MSGS),
    "get": render_msgs(GET_MSGS),
    "get-two-frames": render_msgs(GET_TWO_FRAMES_MSGS),
    "raw": "# hello exchange\n" + raw_hex(HELLO_MSGS)
           + "\n# GET, one frame\n" + raw_hex(GET_MSGS)
           + "\n# GET, the two-frame variant (replaces the TENSOR_DATA above)\n"
           + raw_hex(GET_TWO_FRAMES_MSGS),
}

FILES = {
    "hello_exchange.hex": (
        "# Hurray wire v1 example: a HELLO exchange (docs/protocol.md).\n"
        "# Generated by docs/tools/gen_examples.py; do not edit.\n"
        "# Format: OOOO: hex bytes ; field   (OOOO = offset in the message).\n\n"
        + BLOCKS["hello"] + "\n"),
    "get_weights_2x3_f32.hex": (
        "# Hurray wire v1 example: GET of a 2x3 FLOAT32 tensor\n"
        "# \"weights/layer0\" on stream 1 (docs/protocol.md).\n"
        "# Generated by docs/tools/gen_examples.py; do not edit.\n"
        "# Format: OOOO: hex bytes ; field   (OOOO = offset in the message).\n\n"
        + BLOCKS["get"] + "\n"),
    "get_weights_2x3_f32_two_frames.hex": (
        "# Hurray wire v1 example: the same 24 data bytes as two TENSOR_DATA\n"
        "# frames of 16 and 8 bytes (docs/protocol.md).\n"
        "# Generated by docs/tools/gen_examples.py; do not edit.\n"
        "# Format: OOOO: hex bytes ; field   (OOOO = offset in the message).\n\n"
        + BLOCKS["get-two-frames"] + "\n"),
}

# ---------------------------------------------------------------------------
# Checks.
# ---------------------------------------------------------------------------

# Vectors whose `decoded` form the encoder above must reproduce byte for byte.
CHECK_SINGLE = [
    "hello_client_minimal", "hello_server_full", "hello_server_session_fabric",
    "hello_ext_layout_empty_metadata", "prof_hello_server_panel",
    "hello_client_minor_7", "req_minimal", "req_preferences_transcode",
    "req_parallel_k4", "req_region", "req_align_cuda", "req_key_utf8",
    "desc_row_major_f32", "desc_shard_of_parent", "desc_strided_transposed",
    "desc_tiled_padded", "desc_permuted_rank3", "prof_desc_panel_f32_padded",
    "buf_rocm_offset_local", "data_frame", "header_data_end_empty",
    "header_put_ack", "header_cancel",
]
CHECK_SEQUENCES = ["seq_row_major_one_frame", "seq_row_major_three_frames",
                   "shards_two_of_four"]


def find_vectors(cli_dir):
    cands = [cli_dir, os.environ.get("HR_VECTORS"),
             os.path.join(REPO, "..", "shared", "vectors"),
             "/work/shared/vectors"]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "hello.json")):
            return c
    return None


def load_vectors(vdir):
    out = {}
    for name in sorted(os.listdir(vdir)):
        if name.endswith(".json"):
            with open(os.path.join(vdir, name), encoding="utf-8") as f:
                for v in json.load(f)["vectors"]:
                    out[v["name"]] = v
    return out


def check_vectors(vdir, errors):
    vec = load_vectors(vdir)
    n = 0
    for name in CHECK_SINGLE:
        v = vec[name]
        got = encode_decoded(v["decoded"]).hex()
        if got != v["hex"]:
            errors.append("encoder disagrees with vector %s:\n  got  %s\n  want %s"
                          % (name, got, v["hex"]))
        n += 1
    for name in CHECK_SEQUENCES:
        v = vec[name]
        got = "".join(encode_decoded(m).hex() for m in v["decoded"])
        if got != v["hex"]:
            errors.append("encoder disagrees with sequence %s" % name)
        n += 1
    # The examples themselves: the descriptor, the frame and the end of the
    # GET must be exactly the vectors seq_row_major_one_frame (same tensor,
    # same stream), and the client HELLO must differ from
    # hello_client_minimal only where the example says so.
    seq = bytes.fromhex(vec["seq_row_major_one_frame"]["hex"])
    ours = b"".join(to_bytes(p) for p, _ in GET_MSGS[1:])
    if ours != seq:
        errors.append("GET answer differs from vector seq_row_major_one_frame")
    if to_bytes(GET_MSGS[1][0]).hex() != vec["desc_row_major_f32"]["hex"]:
        errors.append("GET descriptor differs from vector desc_row_major_f32")
    two = b"".join(to_bytes(p) for p, _ in GET_TWO_FRAMES_MSGS)
    if len(two) != 2 * 24 + 24 or two[12:24] != bytes(12):
        errors.append("two-frame variant has an unexpected shape")
    n += 2
    return n


def splice_doc(text, blocks):
    """Replaces every generated block of protocol.md; returns the new text."""
    for key, body in blocks.items():
        begin = "<!-- BEGIN gen_examples:%s -->" % key
        end = "<!-- END gen_examples:%s -->" % key
        i = text.find(begin)
        j = text.find(end)
        if i < 0 or j < 0:
            raise SystemExit("docs/protocol.md lacks the markers of block " + key)
        text = (text[:i + len(begin)] + "\n```text\n" + body + "\n```\n"
                + text[j:])
    return text


def main(argv):
    check = "--check" in argv
    vdir = None
    if "--vectors" in argv:
        vdir = argv[argv.index("--vectors") + 1]
    if "--print" in argv:
        for k, body in BLOCKS.items():
            print("==", k)
            print(body)
            print()
        for msgs in (HELLO_MSGS, GET_MSGS, GET_TWO_FRAMES_MSGS):
            print(raw_hex(msgs))
        return 0

    errors = []
    # The renderings must parse back to the encoded bytes.
    for key, msgs in (("hello", HELLO_MSGS), ("get", GET_MSGS),
                      ("get-two-frames", GET_TWO_FRAMES_MSGS)):
        if parse_hex_text(BLOCKS[key]) != [to_bytes(p) for p, _ in msgs]:
            errors.append("rendering of %s does not parse back" % key)

    vd = find_vectors(vdir)
    if vd is None:
        print("note: test vectors not found; vector cross-checks skipped")
    else:
        n = check_vectors(vd, errors)
        print("checked %d vectors/examples against %s" % (n, vd))

    if check:
        for name, body in FILES.items():
            path = os.path.join(EXAMPLES, name)
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() != body:
                        errors.append("%s is out of date" % path)
            except OSError:
                errors.append("%s is missing" % path)
        try:
            with open(DOC, encoding="utf-8") as f:
                text = f.read()
            if splice_doc(text, BLOCKS) != text:
                errors.append("docs/protocol.md examples are out of date")
        except OSError:
            errors.append("%s is missing" % DOC)
    elif not errors:
        os.makedirs(EXAMPLES, exist_ok=True)
        for name, body in FILES.items():
            with open(os.path.join(EXAMPLES, name), "w", encoding="utf-8") as f:
                f.write(body)
        if os.path.exists(DOC):
            with open(DOC, encoding="utf-8") as f:
                text = f.read()
            new = splice_doc(text, BLOCKS)
            if new != text:
                with open(DOC, "w", encoding="utf-8") as f:
                    f.write(new)

    for e in errors:
        print("error: " + e, file=sys.stderr)
    if not errors:
        print("ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
