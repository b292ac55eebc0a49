/*
 * Invariants shared by the libFuzzer targets.
 */
#include "fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hr_fuzz_fail(const char *what) {
  fprintf(stderr, "fuzz invariant broken: %s\n", what);
  abort();
}

void hr_fuzz_check_roundtrip(const hr_msg *m, const uint8_t *bytes,
                             size_t len) {
  int64_t size = hr_wire_encoded_size(m);
  if (size != (int64_t)len)
    hr_fuzz_fail("hr_wire_encoded_size differs from the decoded length");
  /* One spare byte so that a zero-length malloc never happens. */
  uint8_t *out = malloc(len + 1);
  if (out == NULL)
    hr_fuzz_fail("out of memory");
  if (hr_wire_encode(m, out, len - 1) != HR_ERR_BUFFER_TOO_SMALL)
    hr_fuzz_fail("hr_wire_encode accepted a buffer one byte short");
  if (hr_wire_encode(m, out, len) != (int64_t)len)
    hr_fuzz_fail("hr_wire_encode returned another length");
  if (memcmp(out, bytes, len) != 0)
    hr_fuzz_fail("a decoded message re-encodes to other bytes");
  free(out);
}

void hr_fuzz_check_rejection(int rc, const hr_wire_status *st) {
  if (rc != HR_ERR_PROTO)
    hr_fuzz_fail("a rejection that is not HR_ERR_PROTO");
  if (st->code == HR_WIRE_NO_ERROR || st->code > HR_WIRE_ERROR_LAST)
    hr_fuzz_fail("a rejection with an undefined wire code");
  if (st->reason == NULL)
    hr_fuzz_fail("a rejection without a reason");
}

/* A registered profile that parses must encode back to its metadata. */
static void check_entry(const hr_layout_entry *e) {
  hr_layout_profile p;
  int rc = hr_layout_profile_parse(e, &p);
  if (e->tag < HR_LAYOUT_PANEL || e->tag > HR_LAYOUT_PERMUTED_EXACT) {
    if (rc != HR_ERR_UNSUPPORTED)
      hr_fuzz_fail("hr_layout_profile_parse accepted an unregistered tag");
    return;
  }
  if (rc == HR_ERR_INVALID_ARGUMENT)
    return;
  if (rc != 0)
    hr_fuzz_fail("hr_layout_profile_parse: unexpected return");
  uint8_t out[1 + 4 * HR_MAX_RANK];
  int n = hr_layout_profile_encode(&p, out, sizeof(out));
  if (n != (int)e->ext_len || memcmp(out, e->ext, e->ext_len) != 0)
    hr_fuzz_fail("a parsed profile encodes to other metadata");
}

static void check_descriptor(const hr_descriptor *d,
                             const hr_transport_fields *x,
                             const hr_wire_ctx *ctx) {
  hr_wire_status st = {0};
  if (hr_descriptor_validate(d, x, ctx, 0, &st) != 0)
    hr_fuzz_fail("a decoded descriptor does not validate");
  check_entry(&d->layout);
  uint64_t sizes[HR_MAX_BUFFERS];
  int n = hr_descriptor_buffer_sizes(d, sizes, &st);
  if (n == HR_ERR_UNSUPPORTED && d->layout.tag > HR_LAYOUT_PANEL)
    return;
  if (n < 0)
    hr_fuzz_fail("hr_descriptor_buffer_sizes rejects a decoded descriptor");
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    if (n != 0)
      hr_fuzz_fail("a composite head with buffer sizes");
    return;
  }
  if (n != d->buffer_count)
    hr_fuzz_fail("buffer count differs from the layout's");
  for (int i = 0; i < n; i++) {
    uint64_t have = d->buffers[i].size_bytes;
    if (d->layout.tag == HR_LAYOUT_STRIDED ? have < sizes[i] : have != sizes[i])
      hr_fuzz_fail("a decoded buffer size disagrees with the layout");
  }
}

void hr_fuzz_check_decoded(const hr_msg *m, const hr_wire_ctx *ctx) {
  size_t pos = 0, count = 0;
  switch (m->hdr.type) {
  case HR_MSG_CLIENT_HELLO:
  case HR_MSG_SERVER_HELLO: {
    const hr_hello *h = &m->u.hello;
    hr_ext e;
    while (hr_ext_next(h->ext_raw, h->ext_raw_len, &pos, &e) == 1)
      count++;
    if (count != h->ext_count || pos != h->ext_raw_len)
      hr_fuzz_fail("HELLO extensions do not iterate to ext_count");
    for (unsigned i = 0; i < h->layout_count; i++)
      check_entry(&h->layouts[i]);
    break;
  }
  case HR_MSG_TENSOR_REQUEST:
    for (unsigned i = 0; i < m->u.request.layout_count; i++)
      check_entry(&m->u.request.layouts[i]);
    break;
  case HR_MSG_LIST_RESPONSE: {
    const hr_list_response *r = &m->u.list_response;
    hr_list_entry e;
    while (hr_list_entry_next(r->entries_raw, r->entries_raw_len, &pos, &e) ==
           1)
      count++;
    if (count != r->entry_count || pos != r->entries_raw_len)
      hr_fuzz_fail("LIST_RESPONSE entries do not iterate to entry_count");
    break;
  }
  case HR_MSG_TENSOR_DESCRIPTOR:
    check_descriptor(&m->u.tensor.desc, &m->u.tensor.xport, ctx);
    break;
  case HR_MSG_TENSOR_PUT:
    check_descriptor(&m->u.put.desc, &m->u.put.xport, ctx);
    break;
  default: break;
  }
}
