/*
 * Shard placement and validation on the client, against a scripted
 * server: valid tilings land in place in one destination buffer whatever
 * the order of their messages; every inconsistency the proto checkers
 * know (holes, overlaps, parent_shape, total_shards, duplicate index, N
 * above K, element type, layout, HAS_SHARD missing, a box leaving its
 * parent) fails the GET with the right code, the ERROR on the offending
 * stream and CANCEL on the others, without a byte landing outside the
 * destination and without a leak.  The same over two lanes: the client's
 * ERROR and CANCELs go on lane 0 whichever lane carried the fault.
 */
#include "lanes/lanes.h"

#define ROWS 9
#define COLS 6

typedef struct shard_spec {
  uint32_t sid;
  uint16_t index, total;
  uint8_t elem, layout;
  int no_shard_flag;
  uint64_t parent[2], off[2], shape[2];
} shard_spec;

/* One message of the script: encoded bytes of one stream, in order. */
typedef struct script {
  uint8_t *msg[256];
  size_t len[256];
  uint32_t sid[256];
  int n;
} script;

static void sc_add(script *sc, uint32_t sid, const uint8_t *b, size_t n) {
  assert_true(sc->n < 256);
  sc->msg[sc->n] = malloc(n);
  memcpy(sc->msg[sc->n], b, n);
  sc->len[sc->n] = n;
  sc->sid[sc->n] = sid;
  sc->n++;
}

static void sc_free(script *sc) {
  for (int i = 0; i < sc->n; i++)
    free(sc->msg[i]);
  sc->n = 0;
}

static uint8_t parent_at(uint64_t i, uint64_t j) {
  return (uint8_t)(i * 31 + j * 7 + 3);
}

/* Appends the descriptor, frames of 5 bytes and DATA_END of one shard. */
static void sc_shard(script *sc, const shard_spec *sp) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DESCRIPTOR;
  m.hdr.stream_id = sp->sid;
  hr_descriptor *d = &m.u.tensor.desc;
  d->descriptor_version = 1;
  d->element_type = sp->elem;
  d->rank = 2;
  d->flags = sp->no_shard_flag ? 0 : HR_DESC_HAS_SHARD;
  d->layout.tag = sp->layout;
  uint64_t esz = sp->elem == HR_ELEM_UINT16 ? 2 : 1;
  uint64_t bytes = sp->shape[0] * sp->shape[1] * esz;
  for (int k = 0; k < 2; k++) {
    d->shape[k] = sp->shape[k];
    if (!sp->no_shard_flag) {
      d->parent_shape[k] = sp->parent[k];
      d->shard_offset[k] = sp->off[k];
    }
  }
  d->buffer_count = 1;
  d->buffers[0].size_bytes = bytes;
  m.u.tensor.xport.total_data_bytes = bytes;
  m.u.tensor.xport.shard_index = sp->index;
  m.u.tensor.xport.total_shards = sp->total;
  uint8_t b[512];
  int64_t k = hr_wire_encode(&m, b, sizeof b);
  assert_true(k > 0);
  sc_add(sc, sp->sid, b, (size_t)k);
  uint8_t data[256];
  assert_true(bytes <= sizeof data);
  for (uint64_t i = 0; i < sp->shape[0]; i++)
    for (uint64_t j = 0; j < sp->shape[1]; j++) {
      uint8_t v = parent_at(sp->off[0] + i, sp->off[1] + j);
      uint64_t e = sp->layout == HR_LAYOUT_ROW_MAJOR ? i * sp->shape[1] + j
                                                     : j * sp->shape[0] + i;
      for (uint64_t x = 0; x < esz; x++)
        data[e * esz + x] = v;
    }
  for (uint64_t o = 0; o < bytes; o += 5) {
    uint32_t len = (uint32_t)(bytes - o < 5 ? bytes - o : 5);
    assert_int_equal(hr_wire_encode_data_prefix(b, sp->sid, 0, o, len), 24);
    memcpy(b + 24, data + o, len);
    sc_add(sc, sp->sid, b, 24 + len);
  }
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA_END;
  m.hdr.stream_id = sp->sid;
  k = hr_wire_encode(&m, b, sizeof b);
  sc_add(sc, sp->sid, b, (size_t)k);
}

/* The order messages are fed in: a random interleaving that keeps each
 * stream's own order. */
static void sc_shuffle(script *sc, uint64_t *seed) {
  int order[256], next[256] = {0}, n = 0;
  uint32_t sids[64];
  int nsid = 0;
  for (int i = 0; i < sc->n; i++) {
    int f = -1;
    for (int j = 0; j < nsid; j++)
      if (sids[j] == sc->sid[i])
        f = j;
    if (f < 0)
      sids[nsid++] = sc->sid[i];
  }
  /* Per stream, the indexes of its messages in order. */
  int idx[64][256], cnt[64] = {0};
  for (int i = 0; i < sc->n; i++)
    for (int j = 0; j < nsid; j++)
      if (sids[j] == sc->sid[i])
        idx[j][cnt[j]++] = i;
  while (n < sc->n) {
    int j = (int)(t_rand(seed) % (uint32_t)nsid);
    if (next[j] < cnt[j])
      order[n++] = idx[j][next[j]++];
  }
  script out = {{0}, {0}, {0}, 0};
  for (int i = 0; i < n; i++) {
    out.msg[i] = sc->msg[order[i]];
    out.len[i] = sc->len[order[i]];
    out.sid[i] = sc->sid[order[i]];
  }
  out.n = n;
  *sc = out;
}

/* A client session (or group of lanes) facing a scripted server. */
typedef struct rig {
  lnet n;
  uint8_t *dest; /* guard | buffer | guard */
  uint64_t cap;
  result r;
  uint32_t sid;
} rig;

#define GUARD 64

static void rig_open(rig *g, int lanes, uint16_t k, uint64_t cap) {
  memset(g, 0, sizeof *g);
  g->n.use_fm = 1;
  hr_test_failmem_init(&g->n.fm, -1);
  assert_int_equal(lnet_open(&g->n, lanes, NULL, NULL), 0);
  /* From here on the server side is scripted: its sessions go. */
  for (int i = 0; i < lanes; i++) {
    hr_session_del(g->n.s[i]);
    g->n.s[i] = NULL;
  }
  g->cap = cap;
  g->dest = malloc(cap + 2 * GUARD);
  memset(g->dest, 0xEE, cap + 2 * GUARD);
  hr_get_dest dest = {g->dest + GUARD, cap, NULL, NULL};
  hr_get_opts o = get_opts("x");
  o.flags = HR_REQ_PARALLEL_OK;
  o.max_shards = k;
  o.dest = &dest;
  assert_int_equal(hr_session_get(g->n.c[0], &o, on_get_done, &g->r, &g->sid),
                   0);
  /* The request leaves on lane 0. */
  hr_iov iov[8];
  int c = hr_session_pull(g->n.c[0], iov, 8, 0);
  assert_true(c > 0);
  size_t tot = 0;
  for (int i = 0; i < c; i++)
    tot += iov[i].len;
  hr_session_consumed(g->n.c[0], tot, 0);
}

/* Feeds the script, message i on lane lane_of[sid] (0 without lanes). */
static void rig_feed(rig *g, script *sc, const int *lane_of) {
  for (int i = 0; i < sc->n; i++) {
    int lane = lane_of ? lane_of[sc->sid[i] - g->sid] : 0;
    assert_int_equal(ln_feed(&g->n, &g->n.c[lane], sc->msg[i], sc->len[i]), 0);
  }
}

/* What the client sent on lane `lane`: ERRORs (stream, code) and CANCEL
 * count. */
typedef struct sent {
  int errors, cancels;
  uint32_t err_sid, err_code;
} sent;

static sent rig_sent(rig *g, int lane) {
  sent out = {0, 0, 0, 0};
  hr_iov iov[64];
  int c = hr_session_pull(g->n.c[lane], iov, 64, 0);
  uint8_t buf[8192];
  size_t len = 0;
  for (int i = 0; i < c; i++) {
    assert_true(len + iov[i].len <= sizeof buf);
    memcpy(buf + len, iov[i].base, iov[i].len);
    len += iov[i].len;
  }
  hr_session_consumed(g->n.c[lane], len, 0);
  size_t pos = 0;
  while (pos + HR_HEADER_SIZE <= len) {
    hr_msg_header h;
    hr_wire_parse_header(buf + pos, &h);
    hr_msg m;
    hr_wire_status ws;
    assert_int_equal(hr_wire_decode(buf + pos,
                                    HR_HEADER_SIZE + h.payload_length, NULL, &m,
                                    &ws),
                     0);
    if (h.type == HR_MSG_ERROR && !out.errors) {
      out.err_sid = h.stream_id;
      out.err_code = m.u.error.code;
    }
    out.errors += h.type == HR_MSG_ERROR;
    out.cancels += h.type == HR_MSG_CANCEL;
    pos += HR_HEADER_SIZE + h.payload_length;
  }
  return out;
}

static void rig_close(rig *g) {
  /* Nothing landed outside the destination. */
  for (int i = 0; i < GUARD; i++) {
    assert_int_equal(g->dest[i], 0xEE);
    assert_int_equal(g->dest[GUARD + g->cap + (uint64_t)i], 0xEE);
  }
  result_clear(&g->r);
  lnet_close(&g->n);
  if (g->n.fm.live != 0)
    fail_msg("%ld blocks leaked", g->n.fm.live);
  free(g->dest);
}

static shard_spec spec(uint32_t sid, uint16_t index, uint16_t total,
                       uint8_t layout, uint64_t r0, uint64_t c0, uint64_t h,
                       uint64_t w) {
  shard_spec s;
  memset(&s, 0, sizeof s);
  s.sid = sid;
  s.index = index;
  s.total = total;
  s.elem = HR_ELEM_UINT8;
  s.layout = layout;
  s.parent[0] = ROWS;
  s.parent[1] = COLS;
  s.off[0] = r0;
  s.off[1] = c0;
  s.shape[0] = h;
  s.shape[1] = w;
  return s;
}

/* Valid tilings land in place, in any message order. */
static void tilings_land_in_place(void **state) {
  (void)state;
  static const struct {
    uint8_t layout;
    int n;
    uint64_t box[8][4]; /* r0, c0, h, w */
  } cases[] = {
      {HR_LAYOUT_ROW_MAJOR, 3, {{0, 0, 3, 6}, {3, 0, 4, 6}, {7, 0, 2, 6}}},
      {HR_LAYOUT_ROW_MAJOR, 2, {{0, 0, 9, 2}, {0, 2, 9, 4}}},
      {HR_LAYOUT_COLUMN_MAJOR, 2, {{0, 0, 9, 5}, {0, 5, 9, 1}}},
      {HR_LAYOUT_COLUMN_MAJOR,
       4,
       {{0, 0, 4, 3}, {4, 0, 5, 3}, {0, 3, 4, 3}, {4, 3, 5, 3}}},
      {HR_LAYOUT_ROW_MAJOR,
       4,
       {{0, 0, 1, 6}, {1, 0, 8, 1}, {1, 1, 8, 1}, {1, 2, 8, 4}}},
  };
  uint64_t seed = 7;
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
    for (int rep = 0; rep < 6; rep++) {
      int n = cases[ci].n;
      rig g;
      rig_open(&g, 1, 8, ROWS * COLS);
      script sc = {{0}, {0}, {0}, 0};
      for (int i = 0; i < n; i++) {
        const uint64_t *b = cases[ci].box[i];
        shard_spec sp = spec(g.sid + (uint32_t)i, (uint16_t)i, (uint16_t)n,
                             cases[ci].layout, b[0], b[1], b[2], b[3]);
        sc_shard(&sc, &sp);
      }
      script all = sc;
      sc_shuffle(&sc, &seed);
      g.n.io.chunked = rep & 1;
      g.n.io.zero_copy = rep & 2;
      rig_feed(&g, &sc, NULL);
      assert_int_equal(g.r.calls, 1);
      if (g.r.status)
        fail_msg("case %zu: %s", ci, g.r.rec.message);
      assert_int_equal(g.r.rec.shards, n);
      /* One tensor in the application's buffer, exactly its size. */
      assert_ptr_equal(hr_tensor_buffer(g.r.t, 0), g.dest + GUARD);
      const hr_descriptor *d = hr_tensor_descriptor(g.r.t);
      assert_int_equal(d->layout.tag, cases[ci].layout);
      assert_false(d->flags & HR_DESC_HAS_SHARD);
      const uint8_t *p = g.dest + GUARD;
      for (uint64_t i = 0; i < ROWS; i++)
        for (uint64_t j = 0; j < COLS; j++) {
          uint64_t e = cases[ci].layout == HR_LAYOUT_ROW_MAJOR ? i * COLS + j
                                                               : j * ROWS + i;
          assert_int_equal(p[e], parent_at(i, j));
        }
      assert_int_equal(rig_sent(&g, 0).errors, 0);
      sc_free(&all);
      rig_close(&g);
    }
}

typedef struct bad_case {
  const char *name;
  int n;
  shard_spec s[3];
  uint32_t code;
  uint16_t k;
} bad_case;

/* Every inconsistency: SHARD_INCONSISTENT (or the code the rules name),
 * the ERROR on the offending stream, CANCEL on the others. */
static void inconsistent_shards(void **state) {
  (void)state;
  const uint8_t R = HR_LAYOUT_ROW_MAJOR;
  bad_case cases[] = {
      {"hole",
       2,
       {spec(1, 0, 2, R, 0, 0, 4, 6), spec(2, 1, 2, R, 5, 0, 4, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       4},
      {"overlap",
       2,
       {spec(1, 0, 2, R, 0, 0, 5, 6), spec(2, 1, 2, R, 4, 0, 5, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       4},
      {"parent_shape",
       2,
       {spec(1, 0, 2, R, 0, 0, 5, 6), spec(2, 1, 2, R, 5, 0, 4, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       4},
      {"total_shards",
       2,
       {spec(1, 0, 2, R, 0, 0, 5, 6), spec(2, 1, 3, R, 5, 0, 4, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       4},
      {"duplicate index",
       2,
       {spec(1, 0, 2, R, 0, 0, 5, 6), spec(2, 0, 2, R, 5, 0, 4, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       4},
      /* The third shard's stream is outside the block: never sent. */
      {"N above K",
       2,
       {spec(1, 0, 3, R, 0, 0, 3, 6), spec(2, 1, 3, R, 3, 0, 3, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       2},
      {"element type",
       2,
       {spec(1, 0, 2, R, 0, 0, 5, 6), spec(2, 1, 2, R, 5, 0, 4, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       4},
      {"layout",
       2,
       {spec(1, 0, 2, R, 0, 0, 5, 6),
        spec(2, 1, 2, HR_LAYOUT_COLUMN_MAJOR, 5, 0, 4, 6)},
       HR_WIRE_SHARD_INCONSISTENT,
       4},
      {"HAS_SHARD missing",
       1,
       {spec(1, 0, 1, R, 0, 0, 9, 6)},
       HR_WIRE_PROTOCOL_VIOLATION,
       4},
      {"box leaves its parent",
       2,
       {spec(1, 0, 2, R, 0, 0, 5, 6), spec(2, 1, 2, R, 5, 2, 4, 6)},
       HR_WIRE_INVALID_DESCRIPTOR,
       4},
  };
  cases[2].s[1].parent[1] = 7;
  cases[6].s[1].elem = HR_ELEM_UINT16;
  cases[8].s[0].no_shard_flag = 1;
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
    for (int lanes = 1; lanes <= 2; lanes++) {
      bad_case *c = &cases[ci];
      rig g;
      rig_open(&g, lanes, c->k, ROWS * COLS * 2);
      script sc = {{0}, {0}, {0}, 0};
      for (int i = 0; i < c->n; i++) {
        shard_spec sp = c->s[i];
        sp.sid += g.sid - 1;
        sc_shard(&sc, &sp);
      }
      /* Shard i on lane i mod L, as a server would send it. */
      int lane_of[8] = {0, 1 % lanes, 2 % lanes, 3 % lanes};
      rig_feed(&g, &sc, lane_of);
      assert_int_equal(g.r.calls, 1);
      if (g.r.rec.wire_error != c->code)
        fail_msg("%s (L=%d): code %u, want %u (%s)", c->name, lanes,
                 g.r.rec.wire_error, c->code, g.r.rec.message);
      assert_int_equal(g.r.status, HR_ERR_PROTO);
      assert_int_equal(g.r.rec.wire_error_sent, 1);
      assert_null(g.r.t);
      /* The ERROR names the faulty stream; CANCEL goes to the others of
       * the block.  With lanes, everything leaves on lane 0. */
      sent s0 = rig_sent(&g, 0);
      assert_int_equal(s0.errors, 1);
      assert_int_equal(s0.err_code, c->code);
      assert_true(s0.err_sid >= g.sid && s0.err_sid < g.sid + c->k);
      assert_true(s0.cancels >= 1 || c->n == 1);
      for (int i = 1; i < lanes; i++) {
        sent si = rig_sent(&g, i);
        assert_int_equal(si.errors + si.cancels, 0);
      }
      /* Late messages on the block are dropped: the lanes stay up. */
      for (int i = 0; i < lanes; i++)
        assert_true(hr_session_want_read(g.n.c[i]));
      assert_int_equal(g.n.errors_c, 0);
      sc_free(&sc);
      rig_close(&g);
    }
}

/* A destination too small for the parent refuses the transfer before a
 * byte lands. */
static void destination_too_small(void **state) {
  (void)state;
  rig g;
  rig_open(&g, 1, 4, ROWS * COLS - 1);
  script sc = {{0}, {0}, {0}, 0};
  shard_spec a = spec(g.sid, 0, 2, HR_LAYOUT_ROW_MAJOR, 0, 0, 5, 6);
  shard_spec b = spec(g.sid + 1, 1, 2, HR_LAYOUT_ROW_MAJOR, 5, 0, 4, 6);
  sc_shard(&sc, &b);
  sc_shard(&sc, &a);
  rig_feed(&g, &sc, NULL);
  assert_int_equal(g.r.calls, 1);
  assert_int_equal(g.r.status, HR_ERR_LIMIT);
  assert_int_equal(g.r.rec.wire_error, HR_WIRE_RESOURCE_EXHAUSTED);
  for (uint64_t i = 0; i < g.cap; i++)
    assert_int_equal(g.dest[GUARD + i], 0xEE);
  sc_free(&sc);
  rig_close(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tilings_land_in_place),
      cmocka_unit_test(inconsistent_shards),
      cmocka_unit_test(destination_too_small),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
