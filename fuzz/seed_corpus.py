#!/usr/bin/env python3
"""Seeds the libFuzzer corpora from the wire-v1 test vectors.

    seed_corpus.py VECTORS_DIR OUT_DIR

writes OUT_DIR/codec/ (one file per message of every vector: the input of
fuzz_codec), OUT_DIR/reader/ (one file per vector: the whole byte stream
behind the fuzz_reader prefix, set up like the vector's sequence), and
OUT_DIR/server_session/ and OUT_DIR/client_session/: whole conversations in
the command format of fuzz/fuzz_session.h, built from the vectors' messages
(a CLIENT_HELLO then requests, PUTs, LISTs, PINGs and CANCELs for the
server; the requests issued, then a SERVER_HELLO and the answers for the
client; RDMA conversations on the fuzzers' fake fabric, SHM answers with
a file descriptor for the client, SHM leases with their releases for the
server, and sessions over several connections (lanes) for both), and
OUT_DIR/device_session/: the client's, with its GETs into the simulated
device and PUTs of device memory.  Only the
Python standard library is used.  Exits 1 when the
folder holds no vectors.
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


# ---- whole-session conversations (fuzz/fuzz_session.h) -------------------

# Driver mode bits, and the commands.
S_MANUAL, S_ZERO_COPY, S_DEFER_WORK, S_DEL_EARLY, S_SMALL = 1, 2, 4, 8, 16
SRV_DEFER_GET, SRV_REGISTRY, SRV_NO_PUT = 32, 64, 128
CLI_LOOSE, CLI_AUTH = 32, 64
MSG_CLIENT_HELLO, MSG_SERVER_HELLO, MSG_REQUEST, MSG_PUT = 1, 2, 3, 7
MSG_CANCEL, MSG_PING, MSG_LIST_REQUEST = 10, 14, 17
# Modes each conversation is written in: plain; zero-copy receive with
# deferred work and small frames; deferred GET answers with manual output.
SERVER_MODES = [0, S_ZERO_COPY | S_DEFER_WORK | S_SMALL,
                SRV_DEFER_GET | S_DEFER_WORK | S_DEL_EARLY]
CLIENT_MODES = [0, S_ZERO_COPY | S_SMALL | CLI_LOOSE]


def feed(data, chunk=None):
    """Commands feeding `data`, in pieces of at most `chunk` bytes."""
    out, pos = bytearray(), 0
    while pos < len(data):
        n = len(data) - pos
        if chunk:
            n = min(n, chunk)
        for op in (3, 2, 1, 0):
            unit = 1 << (4 * op)
            if n >= unit:
                k = min(n // unit, 32)
                out.append(op << 5 | (k - 1))
                out += data[pos:pos + k * unit]
                pos += k * unit
                break
    return bytes(out)


def tick(log2ns):
    return bytes([4 << 5 | log2ns])


def restream(msg, sid):
    return msg[:4] + struct.pack("<I", sid) + msg[8:]


def messages(docs, topic, kind, types=None):
    """(name, bytes) of the single-message vectors of `topic`."""
    out = []
    for v in docs.get(topic, []):
        if v["kind"] != kind or v.get("sequence"):
            continue
        data = bytes.fromhex(v["hex"])
        if len(data) >= 12 and (types is None or data[0] in types):
            out.append((v["name"], data))
    return out


def server_conversations(docs):
    hellos = messages(docs, "hello", "valid", {MSG_CLIENT_HELLO})
    bad_hellos = messages(docs, "hello", "invalid", {MSG_CLIENT_HELLO})
    hello = dict(hellos).get("hello_client_minimal", hellos[0][1])
    reqs = [m for t in ("request", "layout_profiles", "list", "put")
            for m in messages(docs, t, "valid",
                              {MSG_REQUEST, MSG_LIST_REQUEST, MSG_PUT})]
    bad = [m for t in ("request", "layout_profiles", "list", "put", "header",
                       "ping", "error_goaway")
           for m in messages(docs, t, "invalid")]
    ping = dict(messages(docs, "ping", "valid")).get("ping")
    convs = []
    for name, h in hellos + bad_hellos:
        convs.append(("hello-" + name, feed(h)))
    for name, m in reqs:
        convs.append(("one-" + name, feed(hello + restream(m, 1))))
        # The same, one byte at a time, with a CANCEL racing the answer.
        cancel = struct.pack("<BxxxII", MSG_CANCEL, 1, 0)
        convs.append(("cancel-" + name,
                      feed(hello + restream(m, 1), 1) + feed(cancel)))
    for name, m in bad:
        convs.append(("bad-" + name, feed(hello + restream(m, 1))))
    for v in docs.get("put", []):
        seq = v.get("sequence")
        if seq and seq.get("direction") == "c2s":
            convs.append(("put-" + v["name"],
                          feed(hello + bytes.fromhex(v["hex"]), 7)))
    # Everything at once: each request on its own stream, a PING, then
    # the clock past the read, idle and handshake timeouts.
    allreq = hello + b"".join(restream(m, 1 + 16 * i)
                              for i, (_, m) in enumerate(reqs))
    if ping:
        allreq += ping
    convs.append(("all", feed(allreq) + tick(30) + tick(31) + tick(31)))
    convs.append(("timeout", feed(hello[:20]) + tick(29) + tick(31)))
    out = []
    for name, body in convs:
        for i, mode in enumerate(SERVER_MODES):
            # Deferred GETs are answered at the end (action 4).
            tail = bytes([7 << 5 | 4]) if mode & SRV_DEFER_GET else b""
            out.append(("%s-m%d" % (name, i), bytes([mode]) + body + tail))
    return out


def u8(x):
    return min(int(x), 255)


# fuzz_device_session: GETs into the simulated device with this sync mode
# (None: the plain client target's GETs).
GET_DEVICE = None


def get_action(req, dest_sel=0):
    """The client target's GET command reproducing a vector's request."""
    key = req["tensor_key"].encode("utf-8")[:255]
    if GET_DEVICE is not None and dest_sel == 0:
        out = bytearray([7 << 5 | 3 << 3 | 0, len(key)]) + key
        out.append(GET_DEVICE)
    else:
        out = bytearray([7 << 5 | dest_sel << 3 | 0, len(key)]) + key
    flags = int(req.get("request_flags", 0))
    out += bytes([flags & 255, u8(req.get("max_shards", 1))])
    layouts = req.get("preferred_layouts", [])[:4]
    out.append(len(layouts))
    for e in layouts:
        ext = bytes.fromhex(e.get("ext_metadata", ""))[:15]
        out += bytes([int(e["tag"]), len(ext)]) + ext
    out += bytes([u8(req.get("min_alignment_log2", 0)),
                  u8(req.get("preferred_device", 0))])
    if flags & 4:
        region = req.get("region") or {}
        offs, shape = region.get("offset", []), region.get("shape", [])
        rank = min(len(offs), 4)
        out.append(rank)
        for k in range(rank):
            out += bytes([u8(offs[k]), u8(shape[k])])
    return bytes(out)


def client_conversations(docs):
    shellos = messages(docs, "hello", "valid", {MSG_SERVER_HELLO})
    shellos += messages(docs, "layout_profiles", "valid", {MSG_SERVER_HELLO})
    hello = dict(shellos).get("hello_server_full", shellos[0][1])
    minimal_get = get_action({"tensor_key": "t"})
    convs = []
    for name, h in shellos:
        convs.append(("hello-" + name, minimal_get + feed(h)))
    for topic in ("data_frames", "descriptor_layouts", "composite", "shards",
                  "layout_profiles"):
        for v in docs.get(topic, []):
            seq = v.get("sequence")
            if not seq or seq.get("direction") != "s2c":
                continue
            data = bytes.fromhex(v["hex"])
            base = int(seq.get("base_stream", 1))
            msgs = split(data)
            # The client's first GET gets stream 1: rebase the answer.
            body = b"".join(
                restream(m, struct.unpack_from("<I", m, 4)[0] - base + 1)
                if len(m) >= 12 and struct.unpack_from("<I", m, 4)[0] >= base
                else m for m in msgs)
            act = get_action(seq["request"])
            convs.append(("get-" + v["name"], act + feed(hello + body)))
            convs.append(("dest-" + v["name"],
                          get_action(seq["request"], 2) + feed(hello) +
                          feed(body, 5)))
    # Single answers to a GET (descriptors, errors, GOAWAY) on stream 1.
    for topic, types in (("descriptor_layouts", None),
                         ("descriptor_buffers_sync", None),
                         ("descriptor_limits", None),
                         ("error_goaway", None), ("header", None),
                         ("ping", None), ("rdma", None)):
        for kind in ("valid", "invalid"):
            for name, m in messages(docs, topic, kind, types):
                sid = struct.unpack_from("<I", m, 4)[0]
                convs.append(("msg-" + name, minimal_get +
                              feed(hello + restream(m, 1 if sid else 0))))
    # LIST, PUT and PING answers.
    list_action = bytes([7 << 5 | 2, 0, 0, 100])
    for kind in ("valid", "invalid"):
        for name, m in messages(docs, "list", kind, {18}):
            convs.append(("list-" + name,
                          list_action + feed(hello + restream(m, 1))))
    ack = dict(messages(docs, "header", "valid")).get("header_put_ack")
    put_action = bytes([7 << 5 | 1, 1]) + b"w" + bytes([1, 0])
    if ack:
        convs.append(("put-ack", put_action + feed(hello) + tick(10) +
                      feed(restream(ack, 1))))
    pong = dict(messages(docs, "ping", "valid")).get("pong")
    if pong:
        # PING needs the handshake done; the PONG's opaque data will not
        # match (it is ignored), so the PING ends at teardown.
        convs.append(("ping", feed(hello) + bytes([7 << 5 | 3]) + feed(pong)))
    # Requests of every kind, a CANCEL, then the keepalive and timeouts.
    mix = (minimal_get + put_action + list_action + bytes([7 << 5 | 3]) +
           bytes([7 << 5 | 4, 0]) + feed(hello) + tick(31) + tick(31))
    convs.append(("mix", mix))
    out = []
    for name, body in convs:
        for i, mode in enumerate(CLIENT_MODES):
            out.append(("%s-m%d" % (name, i), bytes([mode]) + body))
    return out


# ---- the RDMA data plane on the fake fabric (fuzz/fuzz_fabric.c) ---------

MSG_DESCRIPTOR, MSG_DATA_END, MSG_RDMA_REGISTER, MSG_RDMA_READY = 4, 6, 12, 13
CAP_RDMA = 4 | 8  # RDMA_DATA_PLANE | RDMA_GPUDIRECT
FAKE_KEY0 = 0x1000  # the fake fabric's first key in each world


def fabric_hello(hello, caps=CAP_RDMA):
    """`hello` with the RDMA flags and a FABRIC_ADDRESS naming the fuzzer's
    fake endpoint "peer" as its only extension (the vector's extension list
    must be its tail: the minimal HELLOs end in an empty one)."""
    body = bytearray(hello[12:])
    (flags,) = struct.unpack_from("<I", body, 8)
    struct.pack_into("<I", body, 8, flags | caps)
    assert body[-2:] == b"\0\0", "the HELLO must end in an empty list"
    value = struct.pack("<H", 4) + b"fake" + struct.pack("<H", 4) + b"peer"
    body = body[:-2] + struct.pack("<HHH", 1, 4, len(value)) + value
    return struct.pack("<III", hello[0], 0, len(body)) + bytes(body)


def msg(mtype, sid, payload=b""):
    return struct.pack("<III", mtype, sid, len(payload)) + payload


def rdma_register(sid, role, length, address, key):
    return msg(MSG_RDMA_REGISTER, sid,
               struct.pack("<BxxxQQQH", role, length, address, key, 0))


def fabric_cmd_server(*b):
    return bytes([7 << 5 | 5]) + bytes(b)


def fabric_cmd_client(*b):
    return bytes([7 << 5 | 7]) + bytes(b)


def server_rdma_conversations(docs):
    hellos = dict(messages(docs, "hello", "valid", {MSG_CLIENT_HELLO}))
    if "hello_client_minimal" not in hellos:
        return []
    hello = fabric_hello(hellos["hello_client_minimal"])
    # GET "big" (32 x 16 uint8: 512 bytes, over the 256-byte threshold).
    key = b"big"
    req = msg(MSG_REQUEST, 1, struct.pack("<H", len(key)) + key +
              struct.pack("<IHBBH", 0, 0, 0, 0, 1))
    ready = msg(MSG_RDMA_READY, 1)
    convs = [
        # Tagged: the peer posts its receives, then READY.
        ("rdma-tagged", feed(hello + req) + fabric_cmd_server(3, 2, 0, 1) +
         feed(ready)),
        # The same with a CANCEL racing the transfer.
        ("rdma-cancel", feed(hello + req) + fabric_cmd_server(3, 2, 0, 1) +
         feed(ready + struct.pack("<BxxxII", MSG_CANCEL, 1, 0))),
        # Destination: the peer registers 512 bytes (the second key of the
        # world, after the server's SOURCE) and names it.
        ("rdma-dest", feed(hello + req) + fabric_cmd_server(5, 2, 0) +
         feed(rdma_register(1, 1, 512, 0, FAKE_KEY0 + 1) + ready)),
        # READY before any receive is posted, then the receives.
        ("rdma-late-recv", feed(hello + req + ready) +
         fabric_cmd_server(3, 2, 0, 1) + fabric_cmd_server(2)),
    ]
    out = []
    for name, body in convs:
        for i, mode in enumerate(SERVER_MODES[:2]):
            out.append(("%s-m%d" % (name, i), bytes([mode]) + body))
    return out


def client_rdma_conversations(docs):
    hellos = dict(messages(docs, "hello", "valid", {MSG_CLIENT_HELLO}))
    if "hello_client_minimal" not in hellos:
        return []
    # A SERVER_HELLO that ends in an empty extension list: the minimal
    # client one, retyped.
    minimal = hellos["hello_client_minimal"]
    hello = fabric_hello(struct.pack("<I", MSG_SERVER_HELLO) + minimal[4:])
    out = []
    for v in docs.get("data_frames", []) + docs.get("descriptor_layouts", []):
        seq = v.get("sequence")
        if not seq or seq.get("direction") != "s2c":
            continue
        msgs = split(bytes.fromhex(v["hex"]))
        if not msgs or msgs[0][0] != MSG_DESCRIPTOR or len(msgs[0]) < 28:
            continue
        desc = bytearray(restream(msgs[0], 1))
        desc[-4] = 1  # data_plane RDMA
        (total,) = struct.unpack_from("<Q", desc, len(desc) - 16)
        if total == 0 or total > 4096:
            continue
        src = rdma_register(1, 0, total, 0, FAKE_KEY0 + 7)
        body = (get_action(seq["request"]) + feed(hello + bytes(desc) + src) +
                fabric_cmd_client(4, total >> 8, total & 255, 1, 0) +
                feed(msg(MSG_DATA_END, 1)))
        for i, mode in enumerate(CLIENT_MODES):
            out.append(("rdma-%s-m%d" % (v["name"], i), bytes([mode]) + body))
            # The same with a destination registered (mode bit 7).
            out.append(("rdma-dest-%s-m%d" % (v["name"], i),
                        bytes([mode | 128]) + body))
        if len(out) >= 24:
            break
    return out


CAP_SHM = 64  # SHM_DATA_PLANE


def client_shm_conversations(docs, device=None):
    """GETs answered over SHM: the descriptor (data_plane 2) arrives with a
    file descriptor (the client target's action 7 with bit 7: the fd comes
    with the next bytes), then TENSOR_DATA_END.  With `device` (device_tag,
    memory_class, sync_mode), one-buffer descriptors name device memory
    exported over SHM instead."""
    hellos = dict(messages(docs, "hello", "valid", {MSG_CLIENT_HELLO}))
    if "hello_client_minimal" not in hellos:
        return []
    minimal = hellos["hello_client_minimal"]
    hello = fabric_hello(struct.pack("<I", MSG_SERVER_HELLO) + minimal[4:],
                         CAP_RDMA | CAP_SHM)
    out = []
    for v in docs.get("data_frames", []) + docs.get("descriptor_layouts", []):
        seq = v.get("sequence")
        if not seq or seq.get("direction") != "s2c":
            continue
        msgs = split(bytes.fromhex(v["hex"]))
        if not msgs or msgs[0][0] != MSG_DESCRIPTOR or len(msgs[0]) > 128:
            continue
        desc = bytearray(restream(msgs[0], 1))
        desc[-4] = 2  # data_plane SHM
        if device:
            # The one buffer handle ends where the 16 transport bytes
            # start, after buffer_count 1.
            if desc[-33] != 1:
                continue
            desc[-23], desc[-22], desc[-19] = device
        body = (get_action(seq["request"]) + feed(hello) +
                bytes([7 << 5 | 7, 0x80 | (len(desc) - 1)]) + bytes(desc) +
                feed(msg(MSG_DATA_END, 1)))
        for i, mode in enumerate(CLIENT_MODES):
            out.append(("shm-%s-m%d" % (v["name"], i), bytes([mode]) + body))
        if len(out) >= 12:
            break
    return out


# ---- the server's SHM leases and lanes (fuzz/fuzz_server_session.c) -----

MSG_ERROR, MSG_RELEASE = 9, 16
CAP_PARALLEL = 2
ERR_DEVICE_UNAVAILABLE = 7


def with_caps(hello, caps):
    """`hello` with capability flags `caps` added."""
    body = bytearray(hello[12:])
    (flags,) = struct.unpack_from("<I", body, 8)
    struct.pack_into("<I", body, 8, flags | caps)
    return hello[:12] + bytes(body)


def join_hello(hello, token):
    """`hello` (ending in an empty extension list) with SESSION_JOIN."""
    body = bytearray(hello[12:])
    assert body[-2:] == b"\0\0", "the HELLO must end in an empty list"
    body = body[:-2] + struct.pack("<HHH", 1, 2, len(token)) + token
    return struct.pack("<III", hello[0], 0, len(body)) + bytes(body)


def get(sid, key, flags=0, max_shards=1):
    key = key.encode()
    return msg(MSG_REQUEST, sid, struct.pack("<H", len(key)) + key +
               struct.pack("<IHBBH", flags, 0, 0, 0, max_shards))


def release(sid):
    return msg(MSG_RELEASE, sid)


def error(sid, code, text=b"fuzz"):
    return msg(MSG_ERROR, sid, struct.pack("<IH", code, len(text)) + text)


def srv_action(arg):
    return bytes([7 << 5 | arg])


def conn(i):
    """The server target's action 6: connection i becomes current."""
    return srv_action(i << 3 | 6)


# The registry's fake randomness (fuzz_server_session.c: fake_random):
# the first session's token.
FIRST_TOKEN = bytes((k * 131) & 255 for k in range(1, 17))


def server_shm_conversations(docs):
    """GETs over the SHM data plane: the client offers SHM_DATA_PLANE and
    the fixtures in segments go as descriptors with a lease, which
    BUFFER_RELEASE (well-formed, on the wrong stream, twice, with a payload)
    or an ERROR ends."""
    hellos = dict(messages(docs, "hello", "valid", {MSG_CLIENT_HELLO}))
    if "hello_client_minimal" not in hellos:
        return []
    hello = with_caps(hellos["hello_client_minimal"], CAP_SHM | CAP_PARALLEL)
    convs = [
        ("shm-release", feed(hello + get(1, "t")) + feed(release(1)) +
         feed(get(3, "w") + get(5, "x") + release(5) + release(3))),
        ("shm-release-early", feed(hello + release(1) + get(1, "big"))),
        ("shm-release-payload", feed(hello + get(1, "big")) +
         feed(msg(MSG_RELEASE, 1, b"\1\2\3\4") + release(1))),
        ("shm-release-twice", feed(hello + get(1, "big")) +
         feed(release(1) + release(1) + get(3, "big")) + tick(30)),
        ("shm-release-other", feed(hello + get(1, "big")) + feed(release(7))),
        ("shm-release-zero", feed(hello + get(1, "big")) + feed(release(0))),
        ("shm-release-unreleased", feed(hello + get(1, "big") + get(3, "t") +
                                        get(5, "w")) + tick(31) + tick(31)),
        ("shm-error", feed(hello + get(1, "img")) +
         feed(error(1, ERR_DEVICE_UNAVAILABLE) + get(3, "img") + release(3))),
        ("shm-cancel", feed(hello + get(1, "big") +
                            struct.pack("<BxxxII", MSG_CANCEL, 1, 0)) +
         feed(release(1))),
        ("shm-frames", feed(hello + get(1, "weights") + get(3, "pair") +
                            get(5, "big", 2, 4) + get(9, "t", 1) +
                            release(1) + release(3) + release(5))),
        ("shm-fd-in", feed(hello) + srv_action(7) + bytes([len(
            get(1, "t")) - 1]) + get(1, "t")),
        ("shm-goaway", feed(hello + get(1, "t") + get(3, "w")) +
         srv_action(0) + feed(release(1) + release(3))),
    ]
    # Every valid request and PUT of the vectors, with the lease released.
    for t in ("request", "put"):
        for name, m in messages(docs, t, "valid", {MSG_REQUEST, MSG_PUT}):
            convs.append(("shm-" + name, feed(hello + restream(m, 1)) +
                          feed(release(1))))
    # A PUT into a segment, then a GET of it over SHM.
    for v in docs.get("put", []):
        seq = v.get("sequence")
        if seq and seq.get("direction") == "c2s":
            data = bytes.fromhex(v["hex"])
            msgs = split(data)
            key_len = struct.unpack_from("<H", msgs[0], 12)[0]
            key = msgs[0][14:14 + key_len].decode("utf-8", "replace")
            convs.append(("shm-put-" + v["name"],
                          feed(hello + data) + feed(get(101, key)) +
                          feed(release(101))))
    out = []
    for name, body in convs:
        for i, mode in enumerate(SERVER_MODES):
            tail = bytes([7 << 5 | 4]) if mode & SRV_DEFER_GET else b""
            out.append(("%s-m%d" % (name, i), bytes([mode]) + body + tail))
    return out


def server_lane_conversations(docs):
    """Sessions over several connections: lane 0's SERVER_HELLO names the
    registry's first token, connections 1-3 join with it (or a wrong one),
    and parallel GETs on lane 0 put their shards on every lane."""
    hellos = dict(messages(docs, "hello", "valid", {MSG_CLIENT_HELLO}))
    if "hello_client_minimal" not in hellos:
        return []
    minimal = hellos["hello_client_minimal"]
    hello = with_caps(minimal, CAP_PARALLEL)
    shm_hello = with_caps(minimal, CAP_PARALLEL | CAP_SHM)
    join = join_hello(hello, FIRST_TOKEN)
    bad_join = join_hello(hello, bytes(16))
    big4 = get(1, "big", 2, 4)
    cancel = struct.pack("<BxxxII", MSG_CANCEL, 1, 0)
    convs = [
        ("lanes-3", feed(hello) + conn(1) + feed(join) + conn(2) +
         feed(join) + conn(0) + feed(big4 + get(5, "x", 2, 8))),
        ("lanes-2-cancel", feed(hello) + conn(1) + feed(join) + conn(0) +
         feed(big4) + feed(struct.pack("<BxxxII", MSG_CANCEL, 2, 0))),
        ("lanes-close", feed(hello) + conn(1) + feed(join) + conn(2) +
         feed(join) + conn(0) + feed(big4) + conn(1) + srv_action(1) +
         conn(0) + feed(get(5, "big", 2, 8))),
        ("lanes-lane0-dies", feed(hello) + conn(1) + feed(join) + conn(0) +
         feed(big4) + srv_action(1) + conn(1) + feed(get(5, "t")) + conn(2) +
         feed(join)),
        ("lanes-bad-join", feed(hello) + conn(1) + feed(bad_join) + conn(2) +
         feed(join) + feed(big4)),
        ("lanes-request-on-lane", feed(hello) + conn(1) + feed(join) +
         feed(big4 + cancel) + conn(0) + feed(get(5, "big", 2, 4) + cancel)),
        ("lanes-shm", feed(shm_hello) + conn(1) + feed(join) + conn(0) +
         feed(get(1, "t") + get(3, "big", 2, 4) +
              release(1))),
        ("lanes-two-sessions", feed(hello) + conn(1) + feed(hello) + conn(2) +
         feed(join) + conn(3) + feed(join_hello(hello, bytes(
             (k * 131) & 255 for k in range(17, 33)))) + conn(0) +
         feed(big4) + conn(1) + feed(big4)),
        ("lanes-timeout", feed(hello) + conn(1) + feed(join) + conn(0) +
         feed(big4) + tick(29) + tick(31) + tick(31)),
    ]
    out = []
    for name, body in convs:
        for i, mode in enumerate(SERVER_MODES):
            tail = bytes([7 << 5 | 4]) if mode & SRV_DEFER_GET else b""
            # The lanes need the registry.
            out.append(("%s-m%d" % (name, i),
                        bytes([mode | SRV_REGISTRY]) + body + tail))
    return out


def token_hello(hello, token):
    """`hello` (ending in an empty extension list) with SESSION_TOKEN."""
    body = bytearray(hello[12:])
    assert body[-2:] == b"\0\0", "the HELLO must end in an empty list"
    body = body[:-2] + struct.pack("<HHH", 1, 3, len(token)) + token
    return struct.pack("<III", hello[0], 0, len(body)) + bytes(body)


def cli_lane(op):
    """The client target's action 5: 1 a new lane, 2 the next connection,
    3 the first."""
    return bytes([7 << 5 | op << 3 | 5])


def client_lane_conversations(docs):
    """A client over two or three lanes: lane 0's SERVER_HELLO carries a
    SESSION_TOKEN, each lane joins (its SERVER_HELLO, or an ERROR), and a
    parallel GET's shards arrive on lane (i mod L), or on the wrong one;
    a lane closes in the middle."""
    hellos = dict(messages(docs, "hello", "valid", {MSG_CLIENT_HELLO}))
    if "hello_client_minimal" not in hellos:
        return []
    minimal = hellos["hello_client_minimal"]
    shello = with_caps(struct.pack("<I", MSG_SERVER_HELLO) + minimal[4:],
                       CAP_PARALLEL)
    token = bytes(range(1, 17))
    hello0 = token_hello(shello, token)
    other = token_hello(shello, bytes(16))
    out = []
    for v in docs.get("shards", []):
        seq = v.get("sequence")
        if not seq or seq.get("direction") != "s2c":
            continue
        base = int(seq.get("base_stream", 1))
        msgs = [restream(m, struct.unpack_from("<I", m, 4)[0] - base + 1)
                for m in split(bytes.fromhex(v["hex"])) if len(m) >= 12]
        act = get_action(seq["request"])

        def on_lanes(nl):
            """Each shard's messages on lane (i mod nl), in order."""
            body = b""
            cur = 0
            for m in msgs:
                lane = (struct.unpack_from("<I", m, 4)[0] - 1) % nl
                while cur != lane:
                    body += cli_lane(2)
                    cur = (cur + 1) % nl
                body += feed(m)
            return body

        convs = [
            ("lanes2-" + v["name"],
             feed(hello0) + cli_lane(1) + feed(shello) + cli_lane(3) + act +
             on_lanes(2)),
            ("lanes3-" + v["name"],
             feed(hello0) + cli_lane(1) + feed(hello0) + cli_lane(1) +
             feed(shello) + cli_lane(3) + act + on_lanes(3)),
            ("lanes-wrong-" + v["name"],
             feed(hello0) + cli_lane(1) + feed(shello) + cli_lane(3) + act +
             on_lanes(1)),
            ("lanes-closed-" + v["name"],
             feed(hello0) + cli_lane(1) + feed(shello) + cli_lane(3) + act +
             feed(msgs[0]) + cli_lane(2) + bytes([7 << 5 | 6]) +
             cli_lane(3) + act + on_lanes(2)),
        ]
        if v["name"] == "shards_two_of_four":
            convs += [
                ("lanes-refused", feed(hello0) + cli_lane(1) +
                 feed(error(0, 15)) + cli_lane(1) + feed(other) +
                 cli_lane(3) + act + on_lanes(1)),
                ("lanes-no-token", feed(shello) + cli_lane(1) + act +
                 on_lanes(1)),
                ("lanes-early", cli_lane(1) + feed(hello0) + cli_lane(1) +
                 cli_lane(1) + feed(shello)),
            ]
        for name, body in convs:
            for i, mode in enumerate(CLIENT_MODES):
                out.append(("%s-m%d" % (name, i), bytes([mode]) + body))
    return out


def device_conversations(docs):
    """fuzz_device_session: the client's conversations with every GET into
    the simulated device, producer-synced; those of the data and sync
    vectors also with the EVENT and CONSUMER_STREAM modes; and PUTs of
    the device tensor (tensor 4), answered or over RDMA."""
    global GET_DEVICE
    out = []
    for sync in (0, 1, 2):
        GET_DEVICE = sync
        try:
            convs = client_conversations(docs)
            if sync == 0:
                convs += (client_rdma_conversations(docs) +
                          client_shm_conversations(docs))
                # Device memory exported over SHM (the simulated device's
                # tag, PINNED), producer-synced or with an event.
                for dsync in (0, 1):
                    convs += [("devshm%d-%s" % (dsync, n), b) for n, b in
                              client_shm_conversations(
                                  docs, (0xF0, 1, dsync))]
            else:
                convs = [c for c in convs
                         if c[0].startswith("get-") or "sync" in c[0]]
        finally:
            GET_DEVICE = None
        out += [("dev-s%d-%s" % (sync, n), b) for n, b in convs]
    shellos = messages(docs, "hello", "valid", {MSG_SERVER_HELLO})
    ack = dict(messages(docs, "header", "valid")).get("header_put_ack")
    if shellos and ack:
        hello = dict(shellos).get("hello_server_full", shellos[0][1])
        put_dev = bytes([7 << 5 | 1, 1]) + b"d" + bytes([1, 4])
        for i, mode in enumerate(CLIENT_MODES):
            out.append(("dev-put-m%d" % i, bytes([mode]) + put_dev +
                        feed(hello) + tick(10) + feed(restream(ack, 1))))
    hellos = dict(messages(docs, "hello", "valid", {MSG_CLIENT_HELLO}))
    if "hello_client_minimal" in hellos:
        minimal = hellos["hello_client_minimal"]
        hello = fabric_hello(struct.pack("<I", MSG_SERVER_HELLO) + minimal[4:])
        put_dev = bytes([7 << 5 | 1, 1]) + b"d" + bytes([1, 4])
        ready = msg(MSG_RDMA_READY, 1)
        for i, mode in enumerate(CLIENT_MODES):
            # Tagged: the peer posts its receives, then READY; with a
            # destination registered by the peer (mode bit 7 is the
            # client's own destination flag: unused by a PUT).
            end = feed(restream(ack, 1)) if ack else b""
            out.append(("dev-put-rdma-m%d" % i, bytes([mode]) + put_dev +
                        feed(hello) + fabric_cmd_client(3, 1, 44, 1) +
                        feed(ready) + fabric_cmd_client(2) + end))
            out.append(("dev-put-rdma-dest-m%d" % i, bytes([mode]) +
                        put_dev + feed(hello) + fabric_cmd_client(5, 1, 44) +
                        feed(rdma_register(1, 1, 300, 0, FAKE_KEY0 + 1) +
                             ready) + end))
    return out


def write_all(out_dir, sub, items):
    d = os.path.join(out_dir, sub)
    os.makedirs(d, exist_ok=True)
    for name, data in items:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return len(items)


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
    docs = {}
    for path in files:
        topic = os.path.splitext(os.path.basename(path))[0]
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        docs[topic] = doc.get("vectors", [])
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
    n_server = n_client = n_device = 0
    if files:
        n_server = write_all(out_dir, "server_session",
                             server_conversations(docs) +
                             server_rdma_conversations(docs) +
                             server_shm_conversations(docs) +
                             server_lane_conversations(docs))
        n_client = write_all(out_dir, "client_session",
                             client_conversations(docs) +
                             client_rdma_conversations(docs) +
                             client_shm_conversations(docs) +
                             client_lane_conversations(docs))
        n_device = write_all(out_dir, "device_session",
                             device_conversations(docs))
    print("seeded %d codec, %d reader, %d server, %d client and %d device "
          "session inputs from %d files in %s"
          % (n_codec, n_reader, n_server, n_client, n_device, len(files),
             vectors_dir))
    return 0 if files else 1


if __name__ == "__main__":
    sys.exit(main())
