/*
 * hr_msg -> the vectors' `decoded` JSON shape, and a semantic JSON diff.
 *
 * The shape follows the vectors' README.md: enum fields are numbers, binary
 * fields hex strings, integers of 2^53 or more decimal strings (JSON numbers
 * are doubles), layout_params parsed per layout, `profile` on registered
 * profile entries (0xF0-0xF2), and a parsed `value` on the known HELLO
 * extensions whose content is structured (FABRIC_ADDRESS, PEER_NAME,
 * MAX_SHARDS) when they travel in their own direction, first occurrence
 * only.  The opaque-token extensions carry no `value` in the vectors; their
 * parse is checked separately by vec_check_hello_exts().
 */
#include "vec_json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TWO_POW_53 (UINT64_C(1) << 53)

static cJSON *jobj(void) {
  return vec_chk(cJSON_CreateObject());
}
static cJSON *jarr(void) {
  return vec_chk(cJSON_CreateArray());
}

static void put(cJSON *o, const char *key, cJSON *v) {
  if (!cJSON_AddItemToObject(o, key, vec_chk(v)))
    vec_chk(NULL);
}

static void push(cJSON *a, cJSON *v) {
  if (!cJSON_AddItemToArray(a, vec_chk(v)))
    vec_chk(NULL);
}

static cJSON *ju64(uint64_t v) {
  if (v >= TWO_POW_53) {
    char s[24];
    snprintf(s, sizeof(s), "%" PRIu64, v);
    return cJSON_CreateString(s);
  }
  return cJSON_CreateNumber((double)v);
}

static cJSON *ji64(int64_t v) {
  uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  if (mag >= TWO_POW_53) {
    char s[24];
    snprintf(s, sizeof(s), "%" PRId64, v);
    return cJSON_CreateString(s);
  }
  return cJSON_CreateNumber((double)v);
}

static cJSON *jhex(const uint8_t *p, size_t n) {
  char *s = vec_hex_encode(p, n);
  cJSON *j = cJSON_CreateString(s);
  free(s);
  return j;
}

/* A UTF-8 text field (the decoder validated it). */
static cJSON *jstr(const uint8_t *p, size_t n) {
  char *s = vec_chk(malloc(n + 1));
  if (n > 0)
    memcpy(s, p, n);
  s[n] = '\0';
  cJSON *j = cJSON_CreateString(s);
  free(s);
  return j;
}

static cJSON *ju64_array(const uint64_t *v, unsigned n) {
  cJSON *a = jarr();
  for (unsigned i = 0; i < n; i++)
    push(a, ju64(v[i]));
  return a;
}

static cJSON *jprofile(const hr_layout_entry *e) {
  hr_layout_profile p;
  if (hr_layout_profile_parse(e, &p) != 0)
    return cJSON_CreateNull();
  cJSON *o = jobj();
  if (e->tag == HR_LAYOUT_PANEL) {
    put(o, "mr", ju64(p.mr));
  } else if (e->tag == HR_LAYOUT_TILED_EXACT) {
    put(o, "rank", ju64(p.rank));
    cJSON *a = jarr();
    for (unsigned i = 0; i < p.rank && i < HR_MAX_RANK; i++)
      push(a, ju64(p.tile[i]));
    put(o, "tile", a);
  } else {
    put(o, "rank", ju64(p.rank));
    cJSON *a = jarr();
    for (unsigned i = 0; i < p.rank && i < HR_MAX_RANK; i++)
      push(a, ju64(p.order[i]));
    put(o, "order", a);
  }
  return o;
}

static cJSON *jentry(const hr_layout_entry *e) {
  cJSON *o = jobj();
  put(o, "tag", ju64(e->tag));
  if (e->tag >= HR_LAYOUT_EXT_FIRST && e->tag <= HR_LAYOUT_EXT_LAST) {
    put(o, "ext_metadata", jhex(e->ext, e->ext_len));
    if (e->tag <= HR_LAYOUT_PERMUTED_EXACT)
      put(o, "profile", jprofile(e));
  }
  return o;
}

static cJSON *jentries(const hr_layout_entry *e, unsigned n) {
  cJSON *a = jarr();
  for (unsigned i = 0; i < n && i < HR_MAX_LAYOUTS; i++)
    push(a, jentry(&e[i]));
  return a;
}

static cJSON *jparams(const hr_descriptor *d) {
  const hr_layout_params *p = &d->params;
  unsigned rank = d->rank < HR_MAX_RANK ? d->rank : HR_MAX_RANK;
  cJSON *o = jobj();
  cJSON *a;
  switch (d->layout.tag) {
  case HR_LAYOUT_STRIDED:
    put(o, "origin", ju64(p->origin));
    a = jarr();
    for (unsigned i = 0; i < rank; i++)
      push(a, ji64(p->strides[i]));
    put(o, "strides", a);
    break;
  case HR_LAYOUT_PERMUTED:
    a = jarr();
    for (unsigned i = 0; i < rank; i++)
      push(a, ju64(p->order[i]));
    put(o, "order", a);
    break;
  case HR_LAYOUT_TILED:
    a = jarr();
    for (unsigned i = 0; i < rank; i++)
      push(a, ju64(p->tile[i]));
    put(o, "tile", a);
    break;
  case HR_LAYOUT_SPARSE_COO:
    put(o, "nnz", ju64(p->nnz));
    put(o, "index_type", ju64(p->index_type));
    put(o, "sorted", ju64(p->sorted));
    break;
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
    put(o, "nnz", ju64(p->nnz));
    put(o, "index_type", ju64(p->index_type));
    break;
  case HR_LAYOUT_SPARSE_BSR:
    put(o, "br", ju64(p->br));
    put(o, "bc", ju64(p->bc));
    put(o, "nnz_blocks", ju64(p->nnz));
    put(o, "index_type", ju64(p->index_type));
    break;
  case HR_LAYOUT_COMPOSITE:
    put(o, "member_count", ju64(p->member_count));
    put(o, "rule", ju64(p->rule));
    if (p->rule == HR_COMPOSITE_CONCAT ||
        p->rule == HR_COMPOSITE_GROUP_QUANTIZED)
      put(o, "axis", ju64(p->axis));
    if (p->rule == HR_COMPOSITE_GROUP_QUANTIZED) {
      put(o, "group_size", ju64(p->group_size));
      put(o, "has_zero_point", ju64(p->has_zero_point));
    }
    break;
  default:
    /* PANEL's parameters are empty (mr is in ext_metadata); every other
     * extension layout's parameters are opaque bytes. */
    if (d->layout.tag > HR_LAYOUT_PANEL)
      put(o, "opaque", jhex(d->params_raw, d->params_len));
    break;
  }
  return o;
}

static cJSON *jdescriptor(const hr_descriptor *d) {
  unsigned rank = d->rank < HR_MAX_RANK ? d->rank : HR_MAX_RANK;
  cJSON *o = jobj();
  put(o, "descriptor_version", ju64(d->descriptor_version));
  put(o, "element_type", ju64(d->element_type));
  put(o, "rank", ju64(d->rank));
  put(o, "flags", ju64(d->flags));
  put(o, "layout", jentry(&d->layout));
  put(o, "shape", ju64_array(d->shape, rank));
  put(o, "layout_params", jparams(d));
  put(o, "byte_offset", ju64(d->byte_offset));
  if (d->flags & HR_DESC_HAS_SHARD) {
    put(o, "parent_shape", ju64_array(d->parent_shape, rank));
    put(o, "shard_offset", ju64_array(d->shard_offset, rank));
  }
  put(o, "buffer_count", ju64(d->buffer_count));
  cJSON *a = jarr();
  for (unsigned i = 0; i < d->buffer_count && i < HR_MAX_BUFFERS; i++) {
    const hr_buffer_handle *b = &d->buffers[i];
    cJSON *bo = jobj();
    put(bo, "size_bytes", ju64(b->size_bytes));
    put(bo, "alignment_log2", ju64(b->alignment_log2));
    put(bo, "device_tag", ju64(b->device_tag));
    put(bo, "memory_class", ju64(b->memory_class));
    put(bo, "device_index", ju64(b->device_index));
    put(bo, "sync_mode", ju64(b->sync_mode));
    push(a, bo);
  }
  put(o, "buffers", a);
  return o;
}

static void put_xport(cJSON *o, const hr_transport_fields *x) {
  put(o, "total_data_bytes", ju64(x->total_data_bytes));
  put(o, "shard_index", ju64(x->shard_index));
  put(o, "total_shards", ju64(x->total_shards));
  put(o, "data_plane", ju64(x->data_plane));
}

/* Whether extension `type` is sent by the sender of a HELLO of type
 * `msg_type` (§ 6: AUTH_TOKEN and SESSION_JOIN by clients, SESSION_TOKEN
 * and MAX_SHARDS by servers, the others by either). */
static int ext_own_direction(uint32_t msg_type, uint16_t type) {
  int client = msg_type == HR_MSG_CLIENT_HELLO;
  switch (type) {
  case HR_EXT_AUTH_TOKEN:
  case HR_EXT_SESSION_JOIN: return client;
  case HR_EXT_SESSION_TOKEN:
  case HR_EXT_MAX_SHARDS: return !client;
  case HR_EXT_FABRIC_ADDRESS:
  case HR_EXT_PEER_NAME: return 1;
  default: return 0;
  }
}

static cJSON *jext_value(const hr_hello_exts *x, uint16_t type) {
  cJSON *o = jobj();
  switch (type) {
  case HR_EXT_FABRIC_ADDRESS:
    if (!x->has_fabric_address) {
      cJSON_Delete(o);
      return cJSON_CreateNull();
    }
    put(o, "provider", jstr(x->fabric_provider, x->fabric_provider_len));
    put(o, "endpoint_name", jhex(x->fabric_endpoint, x->fabric_endpoint_len));
    break;
  case HR_EXT_PEER_NAME:
    put(o, "name", jstr(x->peer_name, x->peer_name_len));
    break;
  default: /* HR_EXT_MAX_SHARDS */
    put(o, "max_shards", ju64(x->max_shards));
    break;
  }
  return o;
}

static cJSON *jhello(const hr_msg *m) {
  const hr_hello *h = &m->u.hello;
  cJSON *o = jobj();
  put(o, "magic", ju64(h->magic));
  put(o, "version_major", ju64(h->version_major));
  put(o, "version_minor", ju64(h->version_minor));
  put(o, "capability_flags", ju64(h->capability_flags));
  put(o, "max_message_size", ju64(h->max_message_size));
  put(o, "supported_layouts", jentries(h->layouts, h->layout_count));
  cJSON *a = jarr();
  for (unsigned i = 0; i < h->device_count; i++)
    push(a, ju64(h->devices[i]));
  put(o, "supported_devices", a);
  a = jarr();
  for (unsigned i = 0; i < h->memory_class_count; i++)
    push(a, ju64(h->memory_classes[i]));
  put(o, "supported_memory_classes", a);

  a = jarr();
  size_t pos = 0;
  unsigned seen = 0; /* bit t: extension type t (1-6) already met */
  hr_ext e;
  while (hr_ext_next(h->ext_raw, h->ext_raw_len, &pos, &e) == 1) {
    cJSON *eo = jobj();
    put(eo, "type", ju64(e.type));
    put(eo, "data", jhex(e.data, e.length));
    if (e.type >= HR_EXT_FABRIC_ADDRESS && e.type <= HR_EXT_MAX_SHARDS &&
        ext_own_direction(m->hdr.type, e.type) && !(seen & (1u << e.type)))
      put(eo, "value", jext_value(&h->exts, e.type));
    if (e.type >= 1 && e.type <= 6)
      seen |= 1u << e.type;
    push(a, eo);
  }
  put(o, "extensions", a);
  return o;
}

static cJSON *jlist_response(const hr_list_response *r) {
  cJSON *o = jobj();
  put(o, "more", ju64(r->more));
  cJSON *a = jarr();
  size_t pos = 0;
  hr_list_entry e;
  while (hr_list_entry_next(r->entries_raw, r->entries_raw_len, &pos, &e) ==
         1) {
    cJSON *eo = jobj();
    put(eo, "key", jstr(e.key, e.key_len));
    put(eo, "element_type", ju64(e.element_type));
    put(eo, "layout_tag", ju64(e.layout_tag));
    put(eo, "rank", ju64(e.rank));
    put(eo, "shape",
        ju64_array(e.shape, e.rank < HR_MAX_RANK ? e.rank : HR_MAX_RANK));
    put(eo, "total_data_bytes", ju64(e.total_data_bytes));
    push(a, eo);
  }
  put(o, "entries", a);
  return o;
}

static cJSON *jpayload(const hr_msg *m) {
  cJSON *o;
  switch (m->hdr.type) {
  case HR_MSG_CLIENT_HELLO:
  case HR_MSG_SERVER_HELLO: return jhello(m);
  case HR_MSG_TENSOR_REQUEST: {
    const hr_request *r = &m->u.request;
    o = jobj();
    put(o, "tensor_key", jstr(r->key, r->key_len));
    put(o, "request_flags", ju64(r->flags));
    put(o, "preferred_layouts", jentries(r->layouts, r->layout_count));
    put(o, "preferred_device", ju64(r->preferred_device));
    put(o, "min_alignment_log2", ju64(r->min_alignment_log2));
    put(o, "max_shards", ju64(r->max_shards));
    if (r->flags & HR_REQ_REGION) {
      unsigned n = r->region_rank < HR_MAX_RANK ? r->region_rank : HR_MAX_RANK;
      cJSON *reg = jobj();
      put(reg, "offset", ju64_array(r->region_offset, n));
      put(reg, "shape", ju64_array(r->region_shape, n));
      put(o, "region", reg);
    }
    return o;
  }
  case HR_MSG_TENSOR_DESCRIPTOR:
    o = jobj();
    put(o, "descriptor", jdescriptor(&m->u.tensor.desc));
    put_xport(o, &m->u.tensor.xport);
    return o;
  case HR_MSG_TENSOR_DATA:
    o = jobj();
    put(o, "buffer_index", ju64(m->u.data.buffer_index));
    put(o, "byte_offset_in_buffer", ju64(m->u.data.offset));
    put(o, "data", jhex(m->u.data.data, m->u.data.data_len));
    return o;
  case HR_MSG_TENSOR_PUT:
    o = jobj();
    put(o, "tensor_key", jstr(m->u.put.key, m->u.put.key_len));
    put(o, "put_flags", ju64(m->u.put.flags));
    put(o, "descriptor", jdescriptor(&m->u.put.desc));
    put_xport(o, &m->u.put.xport);
    return o;
  case HR_MSG_ERROR:
    o = jobj();
    put(o, "error_code", ju64(m->u.error.code));
    put(o, "message", jstr(m->u.error.message, m->u.error.message_len));
    return o;
  case HR_MSG_GOAWAY:
    o = jobj();
    put(o, "last_stream_id", ju64(m->u.goaway.last_stream_id));
    put(o, "error_code", ju64(m->u.goaway.code));
    put(o, "message", jstr(m->u.goaway.message, m->u.goaway.message_len));
    return o;
  case HR_MSG_RDMA_REGISTER:
    o = jobj();
    put(o, "role", ju64(m->u.rdma.role));
    put(o, "length", ju64(m->u.rdma.length));
    put(o, "address", ju64(m->u.rdma.address));
    put(o, "key", ju64(m->u.rdma.key));
    put(o, "raw_key", jhex(m->u.rdma.raw_key, m->u.rdma.raw_key_len));
    return o;
  case HR_MSG_PING:
  case HR_MSG_PONG:
    o = jobj();
    put(o, "opaque", ju64(m->u.ping));
    return o;
  case HR_MSG_LIST_REQUEST:
    o = jobj();
    put(o, "prefix",
        jstr(m->u.list_request.prefix, m->u.list_request.prefix_len));
    put(o, "start_after",
        jstr(m->u.list_request.start_after, m->u.list_request.start_after_len));
    put(o, "max_entries", ju64(m->u.list_request.max_entries));
    return o;
  case HR_MSG_LIST_RESPONSE: return jlist_response(&m->u.list_response);
  default: /* the empty-payload messages */ return jobj();
  }
}

cJSON *vec_msg_to_json(const hr_msg *m) {
  cJSON *o = jobj();
  put(o, "message_type", ju64(m->hdr.type));
  put(o, "message_name", cJSON_CreateString(hr_msg_type_name(m->hdr.type)));
  put(o, "stream_id", ju64(m->hdr.stream_id));
  put(o, "payload", jpayload(m));
  return o;
}

/* One opaque extension as the decoder should have parsed it: the first
 * entry of its type, when the type travels in this direction. */
static int check_opaque_ext(const hr_msg *m, uint16_t type, const uint8_t *got,
                            uint16_t got_len, const char *field,
                            vec_buf *diag) {
  const hr_hello *h = &m->u.hello;
  size_t pos = 0;
  hr_ext e;
  const hr_ext *first = NULL;
  while (hr_ext_next(h->ext_raw, h->ext_raw_len, &pos, &e) == 1) {
    if (e.type == type) {
      first = &e;
      break;
    }
  }
  if (first == NULL || !ext_own_direction(m->hdr.type, type)) {
    if (got != NULL || got_len != 0) {
      vec_buf_printf(diag, "hello exts.%s: expected absent, got %u bytes\n",
                     field, got_len);
      return -1;
    }
    return 0;
  }
  if (got_len != first->length || (first->length > 0 && got != first->data)) {
    vec_buf_printf(diag,
                   "hello exts.%s: expected the first entry's %u bytes at "
                   "its data, got %u bytes at another place\n",
                   field, first->length, got_len);
    return -1;
  }
  return 0;
}

int vec_check_hello_exts(const hr_msg *m, vec_buf *diag) {
  if (m->hdr.type != HR_MSG_CLIENT_HELLO && m->hdr.type != HR_MSG_SERVER_HELLO)
    return 0;
  const hr_hello_exts *x = &m->u.hello.exts;
  int rc = 0;
  rc |= check_opaque_ext(m, HR_EXT_AUTH_TOKEN, x->auth_token, x->auth_token_len,
                         "auth_token", diag);
  rc |= check_opaque_ext(m, HR_EXT_SESSION_JOIN, x->session_join,
                         x->session_join_len, "session_join", diag);
  rc |= check_opaque_ext(m, HR_EXT_SESSION_TOKEN, x->session_token,
                         x->session_token_len, "session_token", diag);

  /* The structured ones: absent (or misdirected) leaves them empty. */
  int has[7] = {0};
  size_t pos = 0;
  hr_ext e;
  while (hr_ext_next(m->u.hello.ext_raw, m->u.hello.ext_raw_len, &pos, &e) == 1)
    if (e.type >= 1 && e.type <= 6 && ext_own_direction(m->hdr.type, e.type))
      has[e.type] = 1;
  if (!has[HR_EXT_FABRIC_ADDRESS] && x->has_fabric_address) {
    vec_buf_printf(diag, "hello exts.has_fabric_address set without one\n");
    rc = -1;
  }
  if (!has[HR_EXT_PEER_NAME] && x->peer_name != NULL) {
    vec_buf_printf(diag, "hello exts.peer_name set without one\n");
    rc = -1;
  }
  if (!has[HR_EXT_MAX_SHARDS] && x->max_shards != 0) {
    vec_buf_printf(diag, "hello exts.max_shards %u without one\n",
                   x->max_shards);
    rc = -1;
  }
  return rc;
}

char *vec_json_print(const cJSON *j) {
  if (j == NULL)
    return vec_chk(strdup("(absent)"));
  return vec_chk(cJSON_PrintUnformatted(j));
}

/* Appends one difference, values cut to a readable length. */
static void report(vec_buf *diag, int *count, const char *path,
                   const char *what, const cJSON *want, const cJSON *got) {
  (*count)++;
  if (*count > 12)
    return;
  char *w = vec_json_print(want), *g = vec_json_print(got);
  const size_t cut = 160;
  vec_buf_printf(diag, "%s: %s: expected %.*s%s, got %.*s%s\n",
                 *path ? path : "(top)", what, (int)cut, w,
                 strlen(w) > cut ? "..." : "", (int)cut, g,
                 strlen(g) > cut ? "..." : "");
  free(w);
  free(g);
}

static void diff_rec(const cJSON *want, const cJSON *got, char *path,
                     size_t plen, vec_buf *diag, int *count) {
  const size_t cap = 512;
  if ((want->type & 0xFF) != (got->type & 0xFF)) {
    report(diag, count, path, "type differs", want, got);
    return;
  }
  if (cJSON_IsNumber(want)) {
    if (want->valuedouble != got->valuedouble)
      report(diag, count, path, "value differs", want, got);
  } else if (cJSON_IsString(want)) {
    if (strcmp(want->valuestring, got->valuestring) != 0)
      report(diag, count, path, "value differs", want, got);
  } else if (cJSON_IsArray(want)) {
    int nw = cJSON_GetArraySize(want), ng = cJSON_GetArraySize(got);
    if (nw != ng) {
      char what[64];
      snprintf(what, sizeof(what), "length differs (%d, got %d)", nw, ng);
      report(diag, count, path, what, want, got);
    }
    const cJSON *a = want->child, *b = got->child;
    for (int i = 0; a != NULL && b != NULL; i++, a = a->next, b = b->next) {
      snprintf(path + plen, cap - plen, "[%d]", i);
      diff_rec(a, b, path, strlen(path), diag, count);
      path[plen] = '\0';
    }
  } else if (cJSON_IsObject(want)) {
    const cJSON *a;
    cJSON_ArrayForEach(a, want) {
      snprintf(path + plen, cap - plen, "%s%s", plen ? "." : "", a->string);
      const cJSON *b = cJSON_GetObjectItemCaseSensitive(got, a->string);
      if (b == NULL)
        report(diag, count, path, "missing", a, NULL);
      else
        diff_rec(a, b, path, strlen(path), diag, count);
      path[plen] = '\0';
    }
    cJSON_ArrayForEach(a, got) {
      if (cJSON_GetObjectItemCaseSensitive(want, a->string) != NULL)
        continue;
      snprintf(path + plen, cap - plen, "%s%s", plen ? "." : "", a->string);
      report(diag, count, path, "unexpected field", NULL, a);
      path[plen] = '\0';
    }
  }
}

int vec_json_diff(const cJSON *want, const cJSON *got, const char *path,
                  vec_buf *diag) {
  char p[512];
  snprintf(p, sizeof(p), "%s", path);
  int count = 0;
  diff_rec(want, got, p, strlen(p), diag, &count);
  if (count > 12)
    vec_buf_printf(diag, "... %d differences in all\n", count);
  return count;
}
