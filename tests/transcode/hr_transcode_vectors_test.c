/*
 * The transcoding kernels against the shared JSON test vectors: every
 * valid sequence that carries a `logical` tensor (the row-major elements,
 * shards and regions reassembled, sparse densified, PANEL/TILED/PERMUTED
 * unpacked) is replayed: each tensor's buffers are rebuilt from its
 * frames, then
 *  - transcoded to ROW_MAJOR, it must equal its box of the logical tensor;
 *  - the other way, the logical tensor restricted to that box (a region)
 *    transcoded to the tensor's own layout must give the received buffers
 *    byte for byte (dense targets; CSR and sorted COO for sparse ones).
 *
 * The vectors are found through $HR_VECTORS, else $HR_VECTORS_DEFAULT
 * (set by CTest); without them the test is skipped (exit 77).
 */
/* cmocka needs these three first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
/* clang-format on */

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hurray/transcode.h>

static const char *g_dir;
static unsigned g_forward, g_reverse;

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = 0;
  fclose(f);
  return b;
}

/* An unsigned integer field: a JSON number, or a decimal string for
 * values of 2^53 and above. */
static uint64_t num(const cJSON *o, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
  assert_non_null(v);
  if (cJSON_IsString(v))
    return strtoull(v->valuestring, NULL, 10);
  assert_true(cJSON_IsNumber(v));
  return (uint64_t)v->valuedouble;
}
static int64_t inum(const cJSON *v) {
  if (cJSON_IsString(v))
    return strtoll(v->valuestring, NULL, 10);
  return (int64_t)v->valuedouble;
}

static uint8_t *hex(const char *s, size_t *n) {
  size_t l = strlen(s) / 2;
  uint8_t *b = malloc(l ? l : 1);
  assert_non_null(b);
  for (size_t i = 0; i < l; i++) {
    unsigned v;
    assert_int_equal(sscanf(s + 2 * i, "%2x", &v), 1);
    b[i] = (uint8_t)v;
  }
  *n = l;
  return b;
}

static unsigned esize_of(uint8_t t) {
  switch (t) {
  case HR_ELEM_INT16:
  case HR_ELEM_UINT16:
  case HR_ELEM_FLOAT16:
  case HR_ELEM_BFLOAT16: return 2;
  case HR_ELEM_INT32:
  case HR_ELEM_UINT32:
  case HR_ELEM_FLOAT32: return 4;
  case HR_ELEM_INT64:
  case HR_ELEM_UINT64:
  case HR_ELEM_FLOAT64:
  case HR_ELEM_COMPLEX64: return 8;
  case HR_ELEM_COMPLEX128: return 16;
  default: return 1;
  }
}

static void u64_array(const cJSON *o, const char *name, uint64_t *out) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, name), *e;
  unsigned i = 0;
  assert_non_null(a);
  cJSON_ArrayForEach(e, a) out[i++] = (uint64_t)inum(e);
}

/* A descriptor from its decoded JSON form. */
static void parse_desc(const cJSON *j, hr_descriptor *d, uint8_t *ext) {
  memset(d, 0, sizeof *d);
  d->descriptor_version = (uint8_t)num(j, "descriptor_version");
  d->element_type = (uint8_t)num(j, "element_type");
  d->rank = (uint8_t)num(j, "rank");
  d->flags = (uint8_t)num(j, "flags");
  const cJSON *lay = cJSON_GetObjectItemCaseSensitive(j, "layout");
  d->layout.tag = (uint8_t)num(lay, "tag");
  const cJSON *em = cJSON_GetObjectItemCaseSensitive(lay, "ext_metadata");
  if (em) {
    size_t n;
    uint8_t *b = hex(em->valuestring, &n);
    assert_true(n <= 64);
    memcpy(ext, b, n);
    free(b);
    d->layout.ext = ext;
    d->layout.ext_len = (uint16_t)n;
    const cJSON *prof = cJSON_GetObjectItemCaseSensitive(lay, "profile");
    if (prof && cJSON_GetObjectItemCaseSensitive(prof, "mr"))
      d->params.mr = (uint32_t)num(prof, "mr");
  }
  u64_array(j, "shape", d->shape);
  if (d->flags & HR_DESC_HAS_SHARD) {
    u64_array(j, "parent_shape", d->parent_shape);
    u64_array(j, "shard_offset", d->shard_offset);
  }
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "layout_params"), *e;
  const cJSON *v;
  unsigned i = 0;
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "origin")))
    d->params.origin = (uint64_t)inum(v);
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "strides"))) {
    cJSON_ArrayForEach(e, v) d->params.strides[i++] = inum(e);
  }
  i = 0;
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "order"))) {
    cJSON_ArrayForEach(e, v) d->params.order[i++] = (uint8_t)inum(e);
  }
  i = 0;
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "tile"))) {
    cJSON_ArrayForEach(e, v) d->params.tile[i++] = (uint32_t)inum(e);
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "nnz")))
    d->params.nnz = (uint64_t)inum(v);
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "nnz_blocks")))
    d->params.nnz = (uint64_t)inum(v);
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "index_type")))
    d->params.index_type = (uint8_t)inum(v);
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "sorted")))
    d->params.sorted = (uint8_t)inum(v);
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "br")))
    d->params.br = (uint32_t)inum(v);
  if ((v = cJSON_GetObjectItemCaseSensitive(p, "bc")))
    d->params.bc = (uint32_t)inum(v);
  const cJSON *bufs = cJSON_GetObjectItemCaseSensitive(j, "buffers");
  i = 0;
  cJSON_ArrayForEach(e, bufs) d->buffers[i++].size_bytes = num(e, "size_bytes");
  d->buffer_count = (uint8_t)i;
}

/* One tensor being received on a stream. */
typedef struct rx_tensor {
  uint32_t stream;
  int open;
  hr_descriptor d;
  uint8_t ext[64];
  uint8_t *buf[HR_MAX_BUFFERS];
} rx_tensor;

typedef struct logical {
  unsigned rank, e;
  uint64_t shape[HR_MAX_RANK];
  uint8_t *bytes;
  uint64_t box_off[HR_MAX_RANK]; /* the request's region offset, or 0 */
} logical;

/* Checks one complete tensor against the logical tensor. */
static void check_tensor(const char *name, rx_tensor *t, const logical *L) {
  const hr_descriptor *d = &t->d;
  const unsigned r = d->rank, e = esize_of(d->element_type);
  hr_xc_region reg;
  memset(&reg, 0, sizeof reg);
  for (unsigned k = 0; k < r; k++) {
    uint64_t o = d->flags & HR_DESC_HAS_SHARD ? d->shard_offset[k] : 0;
    reg.offset[k] = o - L->box_off[k];
    reg.shape[k] = d->shape[k];
  }
  /* The expected row-major bytes: the box of the logical tensor. */
  uint64_t n = 1;
  for (unsigned k = 0; k < r; k++)
    n *= d->shape[k];
  uint8_t *exp = malloc(n * e + 1);
  assert_non_null(exp);
  uint64_t idx[HR_MAX_RANK] = {0};
  for (uint64_t j = 0; j < n; j++) {
    uint64_t lin = 0;
    for (unsigned k = 0; k < r; k++)
      lin = lin * L->shape[k] + reg.offset[k] + idx[k];
    memcpy(exp + j * e, L->bytes + lin * e, e);
    for (unsigned k = r; k-- > 0;) {
      if (++idx[k] < d->shape[k])
        break;
      idx[k] = 0;
    }
  }

  /* Forward: the tensor as received, to ROW_MAJOR. */
  hr_xc_tensor src;
  memset(&src, 0, sizeof src);
  src.desc = d;
  for (unsigned b = 0; b < d->buffer_count; b++) {
    src.buffers[b] = t->buf[b];
    src.sizes[b] = d->buffers[b].size_bytes;
  }
  hr_xc_target row = {.layout = HR_LAYOUT_ROW_MAJOR};
  hr_xc_plan *p;
  hr_wire_status st;
  int rv = hr_xc_plan_new(&p, &src, &row, NULL, NULL, NULL, &st);
  if (rv)
    fail_msg("%s: plan: %s", name, rv == HR_ERR_PROTO ? st.reason : "");
  assert_true(hr_xc_plan_out_size(p) == n * e);
  uint8_t *out = malloc(n * e + 1);
  assert_non_null(out);
  assert_int_equal(hr_xc_run(p, 0, n * e, out), 0);
  if (memcmp(out, exp, n * e))
    fail_msg("%s: densified tensor differs from the logical one", name);
  hr_xc_plan_del(p);
  free(out);
  g_forward++;

  /* Reverse: the logical box to the tensor's own layout. */
  hr_descriptor ld;
  memset(&ld, 0, sizeof ld);
  ld.descriptor_version = 1;
  ld.element_type = d->element_type;
  ld.rank = (uint8_t)L->rank;
  memcpy(ld.shape, L->shape, sizeof ld.shape);
  ld.layout.tag = HR_LAYOUT_ROW_MAJOR;
  ld.buffer_count = 1;
  hr_xc_tensor lsrc = {.desc = &ld};
  uint64_t ln = 1;
  for (unsigned k = 0; k < L->rank; k++)
    ln *= L->shape[k];
  lsrc.buffers[0] = L->bytes;
  lsrc.sizes[0] = ln * L->e;
  hr_xc_target tgt = {.layout = d->layout.tag, .params = d->params};
  uint8_t tag = d->layout.tag;
  if (tag == HR_LAYOUT_STRIDED || tag == HR_LAYOUT_SPARSE_BSR ||
      tag == HR_LAYOUT_SPARSE_CSC ||
      (tag == HR_LAYOUT_SPARSE_COO && !d->params.sorted)) {
    free(exp);
    return; /* not a layout the transcoder produces, or not canonical */
  }
  rv = hr_xc_plan_new(&p, &lsrc, &tgt, &reg, NULL, NULL, &st);
  if (rv)
    fail_msg("%s: reverse plan: %d", name, rv);
  if (hr_xc_plan_needs_whole(p)) {
    assert_int_equal(hr_xc_plan_count(p, &st), 0);
    uint64_t sizes[HR_MAX_BUFFERS];
    int nb = hr_xc_plan_buffer_sizes(p, sizes);
    assert_int_equal(nb, d->buffer_count);
    void *bufs[HR_MAX_BUFFERS];
    for (int b = 0; b < nb; b++) {
      assert_true(sizes[b] == d->buffers[b].size_bytes);
      bufs[b] = malloc(sizes[b] + 1);
      assert_non_null(bufs[b]);
    }
    assert_int_equal(hr_xc_run_sparse(p, bufs), 0);
    for (int b = 0; b < nb; b++) {
      if (memcmp(bufs[b], t->buf[b], sizes[b]))
        fail_msg("%s: re-encoded sparse buffer %d differs", name, b);
      free(bufs[b]);
    }
  } else {
    uint64_t sz = hr_xc_plan_out_size(p);
    assert_true(sz == d->buffers[0].size_bytes);
    out = malloc(sz + 1);
    assert_non_null(out);
    assert_int_equal(hr_xc_run(p, 0, sz, out), 0);
    if (memcmp(out, t->buf[0], sz))
      fail_msg("%s: re-encoded buffer differs from the frames", name);
    free(out);
  }
  hr_xc_plan_del(p);
  free(exp);
  g_reverse++;
}

static void run_vector(const cJSON *v) {
  const char *name = cJSON_GetObjectItemCaseSensitive(v, "name")->valuestring;
  const cJSON *lj = cJSON_GetObjectItemCaseSensitive(v, "logical");
  logical L;
  memset(&L, 0, sizeof L);
  L.rank = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(lj, "shape"))
      L.shape[L.rank++] = (uint64_t)inum(e);
  L.e = esize_of((uint8_t)num(lj, "element_type"));
  size_t nbytes;
  L.bytes =
      hex(cJSON_GetObjectItemCaseSensitive(lj, "hex")->valuestring, &nbytes);
  const cJSON *seq = cJSON_GetObjectItemCaseSensitive(v, "sequence");
  const cJSON *req = cJSON_GetObjectItemCaseSensitive(seq, "request");
  const cJSON *region =
      req ? cJSON_GetObjectItemCaseSensitive(req, "region") : NULL;
  if (region)
    u64_array(region, "offset", L.box_off);

  rx_tensor ts[8];
  unsigned nts = 0;
  memset(ts, 0, sizeof ts);
  const cJSON *m;
  cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(v, "decoded")) {
    uint32_t type = (uint32_t)num(m, "message_type");
    uint32_t sid = (uint32_t)num(m, "stream_id");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(m, "payload");
    rx_tensor *t = NULL;
    for (unsigned i = 0; i < nts; i++)
      if (ts[i].stream == sid && ts[i].open)
        t = &ts[i];
    if (type == HR_MSG_TENSOR_DESCRIPTOR || type == HR_MSG_TENSOR_PUT) {
      assert_true(nts < 8);
      t = &ts[nts++];
      t->stream = sid;
      t->open = 1;
      parse_desc(cJSON_GetObjectItemCaseSensitive(pl, "descriptor"), &t->d,
                 t->ext);
      for (unsigned b = 0; b < t->d.buffer_count; b++) {
        t->buf[b] = calloc(1, t->d.buffers[b].size_bytes + 1);
        assert_non_null(t->buf[b]);
      }
    } else if (type == HR_MSG_TENSOR_DATA) {
      assert_non_null(t);
      size_t n;
      uint8_t *b =
          hex(cJSON_GetObjectItemCaseSensitive(pl, "data")->valuestring, &n);
      uint64_t bi = num(pl, "buffer_index"),
               off = num(pl, "byte_offset_in_buffer");
      assert_true(bi < t->d.buffer_count &&
                  off + n <= t->d.buffers[bi].size_bytes);
      memcpy(t->buf[bi] + off, b, n);
      free(b);
    } else if (type == HR_MSG_TENSOR_DATA_END) {
      assert_non_null(t);
      check_tensor(name, t, &L);
      t->open = 0;
    }
  }
  for (unsigned i = 0; i < nts; i++)
    for (unsigned b = 0; b < ts[i].d.buffer_count; b++)
      free(ts[i].buf[b]);
  free(L.bytes);
}

static void test_vectors(void **state) {
  (void)state;
  static const char *files[] = {"data_frames.json", "layout_profiles.json",
                                "shards.json", "put.json"};
  for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, files[f]);
    char *text = read_file(path);
    if (!text)
      fail_msg("cannot read %s", path);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(root, "vectors")) {
      const cJSON *kind = cJSON_GetObjectItemCaseSensitive(v, "kind");
      if (cJSON_GetObjectItemCaseSensitive(v, "logical") && kind &&
          !strcmp(kind->valuestring, "valid"))
        run_vector(v);
    }
    cJSON_Delete(root);
    free(text);
  }
  printf("# %u tensors densified, %u re-encoded\n", g_forward, g_reverse);
  /* The vectors hold about twenty such tensors; far fewer means the
   * replay silently skipped them. */
  assert_true(g_forward >= 20);
  assert_true(g_reverse >= 15);
}

int main(void) {
  g_dir = getenv("HR_VECTORS");
  if (!g_dir || !*g_dir)
    g_dir = getenv("HR_VECTORS_DEFAULT");
  char probe[4096];
  FILE *f = NULL;
  if (g_dir) {
    snprintf(probe, sizeof probe, "%s/data_frames.json", g_dir);
    f = fopen(probe, "rb");
  }
  if (!f) {
    printf("# no test vectors (set HR_VECTORS): skipped\n");
    return 77;
  }
  fclose(f);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_vectors)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
