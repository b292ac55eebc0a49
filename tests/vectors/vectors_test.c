/*
 * Runs every wire-v1 test vector through the codec.
 *
 *  - valid single messages: hr_wire_decode() (and hr_wire_decode_payload())
 *    must give the vector's `decoded` JSON, and hr_wire_encode() of the
 *    decoded struct the exact bytes;
 *  - invalid single messages: rejected with HR_ERR_PROTO and the code the
 *    vector names;
 *  - sequences: each message decoded, compared and fed to an hr_rx set up
 *    from the vector's request; a valid sequence finishes cleanly and its
 *    reassembled tensor equals `logical`; an invalid one fails (at decode,
 *    at hr_rx_on_message or at hr_rx_finish) with the named code.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vec_common.h"
#include "vec_json.h"
#include "vec_logical.h"

static void describe_status(vec_buf *diag, int rc, const hr_wire_status *st) {
  if (rc == HR_ERR_PROTO)
    vec_buf_printf(diag, "HR_ERR_PROTO %s (offset %u: %s)",
                   hr_wire_error_name(st->code), st->offset,
                   st->reason ? st->reason : "(no reason)");
  else
    vec_buf_printf(diag, "rc %d (%s)", rc, hr_strerror(rc));
}

/* The decoded struct must re-encode to exactly the bytes it came from, and
 * a buffer one byte short must be refused without being written. */
static int check_reencode(const hr_msg *m, const uint8_t *p, size_t len,
                          vec_buf *diag) {
  int64_t size = hr_wire_encoded_size(m);
  if (size != (int64_t)len) {
    vec_buf_printf(diag,
                   "re-encode: hr_wire_encoded_size %lld, expected "
                   "%zu\n",
                   (long long)size, len);
    return -1;
  }
  uint8_t *out = vec_chk(malloc(len + 1));
  int rc = 0;
  memset(out, 0xA5, len + 1);
  if (len > 0) {
    int64_t r = hr_wire_encode(m, out, len - 1);
    int untouched = 1;
    for (size_t i = 0; i < len; i++)
      untouched &= out[i] == 0xA5;
    if (r != HR_ERR_BUFFER_TOO_SMALL || !untouched) {
      vec_buf_printf(diag,
                     "re-encode into %zu bytes: returned %lld%s, "
                     "expected HR_ERR_BUFFER_TOO_SMALL and nothing "
                     "written\n",
                     len - 1, (long long)r, untouched ? "" : " and wrote");
      rc = -1;
    }
  }
  int64_t w = hr_wire_encode(m, out, len);
  if (w != (int64_t)len) {
    vec_buf_printf(diag,
                   "re-encode: hr_wire_encode returned %lld, expected "
                   "%zu\n",
                   (long long)w, len);
    rc = -1;
  } else if (memcmp(out, p, len) != 0) {
    size_t i = 0;
    while (out[i] == p[i])
      i++;
    char *want = vec_hex_encode(p, len), *got = vec_hex_encode(out, len);
    vec_buf_printf(diag,
                   "re-encode: bytes differ from offset %zu\n"
                   "  expected %s\n  got      %s\n",
                   i, want, got);
    free(want);
    free(got);
    rc = -1;
  }
  free(out);
  return rc;
}

/* Compares a decoded message with its `decoded` JSON. */
static int check_decoded(const hr_msg *m, const cJSON *want, const char *path,
                         vec_buf *diag) {
  cJSON *got = vec_msg_to_json(m);
  int n = vec_json_diff(want, got, path, diag);
  cJSON_Delete(got);
  int rc = n == 0 ? 0 : -1;
  if (vec_check_hello_exts(m, diag) != 0)
    rc = -1;
  return rc;
}

static int check_single_valid(const cJSON *v, const uint8_t *p, size_t len,
                              const hr_wire_ctx *ctx, vec_buf *diag) {
  const cJSON *decoded = cJSON_GetObjectItemCaseSensitive(v, "decoded");
  if (!cJSON_IsObject(decoded)) {
    vec_buf_printf(diag, "vector: a valid message needs `decoded`\n");
    return -1;
  }
  hr_msg m;
  hr_wire_status st = {0};
  memset(&m, 0, sizeof(m));
  int rc = hr_wire_decode(p, len, ctx, &m, &st);
  if (rc != 0) {
    vec_buf_printf(diag, "hr_wire_decode rejected a valid message: ");
    describe_status(diag, rc, &st);
    vec_buf_printf(diag, "\n");
    return -1;
  }
  int res = 0;
  if (check_decoded(&m, decoded, "", diag) != 0)
    res = -1;
  if (check_reencode(&m, p, len, diag) != 0)
    res = -1;

  /* The frame reader's path: header parsed apart, payload decoded alone. */
  hr_msg_header h;
  hr_msg m2;
  memset(&m2, 0, sizeof(m2));
  hr_wire_parse_header(p, &h);
  rc = hr_wire_decode_payload(&h, p + HR_HEADER_SIZE, ctx, &m2, &st);
  if (rc != 0) {
    vec_buf_printf(diag, "hr_wire_decode_payload rejected it: ");
    describe_status(diag, rc, &st);
    vec_buf_printf(diag, "\n");
    res = -1;
  } else if (check_decoded(&m2, decoded, "(decode_payload)", diag) != 0) {
    res = -1;
  }
  return res;
}

/* Expected code of an invalid vector, or -1 (reported). */
static int expected_code(const cJSON *v, vec_buf *diag) {
  int ok = 1;
  const char *name = vec_get_str(v, "expect_error", &ok);
  int code = ok ? hr_wire_error_from_name(name) : -1;
  if (code < 0)
    vec_buf_printf(diag,
                   "vector: expect_error %s is no error name "
                   "(hr_wire_error_from_name)\n",
                   ok ? name : "(missing)");
  return code;
}

/* A rejection must carry the expected code, a reason, and an offset inside
 * the message (or just past it, for a field cut short). */
static int check_rejection(int rc, const hr_wire_status *st, int code,
                           size_t msg_len, const char *where, vec_buf *diag) {
  if (rc == HR_ERR_PROTO && st->code == (uint32_t)code && st->reason != NULL &&
      st->offset <= msg_len)
    return 0;
  vec_buf_printf(diag, "%s: expected HR_ERR_PROTO %s, got ", where,
                 hr_wire_error_name((uint32_t)code));
  describe_status(diag, rc, st);
  if (rc == HR_ERR_PROTO && st->code == (uint32_t)code)
    vec_buf_printf(diag, " (%s)",
                   st->reason == NULL ? "reason is NULL"
                                      : "offset beyond the message");
  vec_buf_printf(diag, "\n");
  return -1;
}

static int check_single_invalid(const cJSON *v, const uint8_t *p, size_t len,
                                const hr_wire_ctx *ctx, vec_buf *diag) {
  int code = expected_code(v, diag);
  if (code < 0)
    return -1;
  hr_wire_status st = {0};
  int rc;
  if (code == HR_WIRE_MESSAGE_TOO_LARGE) {
    /* hr_wire_decode has no size limit: a size vector is about the limit
     * before the HELLOs, which the header check applies. */
    hr_msg_header h;
    hr_wire_parse_header(p, &h);
    rc = hr_wire_check_header(&h, HR_PREHELLO_MAX_PAYLOAD, ctx, &st);
    return check_rejection(rc, &st, code, len, "hr_wire_check_header", diag);
  }
  hr_msg m;
  memset(&m, 0, sizeof(m));
  rc = hr_wire_decode(p, len, ctx, &m, &st);
  return check_rejection(rc, &st, code, len, "hr_wire_decode", diag);
}

/* ---- sequences ---- */

/* Builds the checker's configuration from the vector's `sequence`. */
static int seq_config(const cJSON *seq, const vec_span *msgs, int n,
                      hr_rx_config *cfg, vec_buf *diag) {
  int ok = 1;
  memset(cfg, 0, sizeof(*cfg));
  const char *dir = vec_get_str(seq, "direction", &ok);
  if (ok && strcmp(dir, "s2c") == 0)
    cfg->direction = HR_RX_S2C;
  else if (ok && strcmp(dir, "c2s") == 0)
    cfg->direction = HR_RX_C2S;
  else
    ok = 0;
  cfg->strict = 1;
  cfg->max_shards = 1;

  const cJSON *base = cJSON_GetObjectItemCaseSensitive(seq, "base_stream");
  uint64_t b = 0;
  if (base != NULL) {
    if (vec_json_u64(base, &b) != 0 || b > UINT32_MAX)
      ok = 0;
  } else if (n > 0) {
    /* A PUT stream is the one its TENSOR_PUT opens. */
    hr_msg_header h;
    hr_wire_parse_header(msgs[0].p, &h);
    b = h.stream_id;
  }
  cfg->base_stream = (uint32_t)b;

  const cJSON *req = cJSON_GetObjectItemCaseSensitive(seq, "request");
  if (req != NULL) {
    uint64_t flags = vec_get_u64(req, "request_flags", &ok);
    uint64_t ms = vec_get_u64(req, "max_shards", &ok);
    cfg->request_flags = (uint32_t)flags;
    cfg->max_shards = (uint16_t)ms;
    const cJSON *reg = cJSON_GetObjectItemCaseSensitive(req, "region");
    if (reg != NULL) {
      unsigned n1 = 0, n2 = 0;
      if (vec_json_u64_array(cJSON_GetObjectItemCaseSensitive(reg, "offset"),
                             cfg->region_offset, HR_MAX_RANK, &n1) != 0 ||
          vec_json_u64_array(cJSON_GetObjectItemCaseSensitive(reg, "shape"),
                             cfg->region_shape, HR_MAX_RANK, &n2) != 0 ||
          n1 != n2)
        ok = 0;
      cfg->region_rank = (uint8_t)n1;
    }
  } else if (cfg->direction == HR_RX_S2C) {
    ok = 0;
  }
  if (!ok) {
    vec_buf_printf(diag, "vector: malformed `sequence`\n");
    return -1;
  }
  return 0;
}

static int check_sequence(const cJSON *v, const uint8_t *p, size_t len,
                          const hr_wire_ctx *ctx, vec_buf *diag) {
  int ok = 1;
  int valid = strcmp(vec_get_str(v, "kind", &ok), "valid") == 0;
  const cJSON *seq = cJSON_GetObjectItemCaseSensitive(v, "sequence");
  const cJSON *decoded = cJSON_GetObjectItemCaseSensitive(v, "decoded");
  const cJSON *logical = cJSON_GetObjectItemCaseSensitive(v, "logical");
  int code = -1;
  if (!valid && (code = expected_code(v, diag)) < 0)
    return -1;

  vec_span *msgs = NULL;
  int n = vec_split(p, len, &msgs);
  if (n < 0) {
    vec_buf_printf(diag, "vector: the bytes do not split into messages\n");
    return -1;
  }
  if (valid && (!cJSON_IsArray(decoded) || cJSON_GetArraySize(decoded) != n)) {
    vec_buf_printf(diag, "vector: `decoded` must list the %d messages\n", n);
    free(msgs);
    return -1;
  }
  hr_rx_config cfg;
  if (seq_config(seq, msgs, n, &cfg, diag) != 0) {
    free(msgs);
    return -1;
  }
  hr_rx *rx = NULL;
  int rc = hr_rx_new(&rx, &cfg, NULL);
  if (rc != 0) {
    vec_buf_printf(diag, "hr_rx_new: rc %d\n", rc);
    free(msgs);
    return -1;
  }

  vec_assembly as = {0};
  int res = 0, failed = 0; /* failed: the codec rejected the sequence */
  int done_at = -1;        /* the message whose event said DONE */
  const cJSON *want = valid ? decoded->child : NULL;
  hr_wire_status st = {0};
  char where[96];
  for (int i = 0; i < n && !failed; i++, want = want ? want->next : NULL) {
    hr_msg m;
    memset(&m, 0, sizeof(m));
    memset(&st, 0, sizeof(st));
    rc = hr_wire_decode(msgs[i].p, msgs[i].len, ctx, &m, &st);
    if (rc != 0) {
      snprintf(where, sizeof(where), "message %d: hr_wire_decode", i);
      if (valid) {
        vec_buf_printf(diag, "%s rejected it: ", where);
        describe_status(diag, rc, &st);
        vec_buf_printf(diag, "\n");
        res = -1;
      } else if (check_rejection(rc, &st, code, msgs[i].len, where, diag) !=
                 0) {
        res = -1;
      }
      failed = 1;
      break;
    }
    if (check_reencode(&m, msgs[i].p, msgs[i].len, diag) != 0) {
      vec_buf_printf(diag, "  (message %d)\n", i);
      res = -1;
    }
    if (valid) {
      char path[32];
      snprintf(path, sizeof(path), "decoded[%d]", i);
      if (check_decoded(&m, want, path, diag) != 0)
        res = -1;
      if (vec_asm_on_msg(&as, &m, diag) != 0)
        res = -1;
    }
    hr_rx_event ev;
    memset(&ev, 0, sizeof(ev));
    rc = hr_rx_on_message(rx, &m, &ev, &st);
    if (rc == 0 && ev.done && done_at < 0)
      done_at = i;
    if (rc != 0) {
      snprintf(where, sizeof(where), "message %d (%s): hr_rx_on_message", i,
               hr_msg_type_name(m.hdr.type));
      if (valid) {
        vec_buf_printf(diag, "%s rejected it: ", where);
        describe_status(diag, rc, &st);
        vec_buf_printf(diag, "\n");
        res = -1;
      } else if (check_rejection(rc, &st, code, msgs[i].len, where, diag) !=
                 0) {
        res = -1;
      }
      failed = 1;
      /* A failed checker is finished: it must not accept the end. */
      hr_wire_status st2 = {0};
      if (hr_rx_finish(rx, &st2) == 0) {
        vec_buf_printf(diag, "hr_rx_finish returned 0 after an error\n");
        res = -1;
      }
    }
  }

  if (!failed) {
    memset(&st, 0, sizeof(st));
    rc = hr_rx_finish(rx, &st);
    if (valid) {
      if (rc != 0) {
        vec_buf_printf(diag, "hr_rx_finish rejected a valid sequence: ");
        describe_status(diag, rc, &st);
        vec_buf_printf(diag, "\n");
        res = -1;
      } else if (!hr_rx_done(rx)) {
        vec_buf_printf(diag, "hr_rx_done is 0 after a complete sequence\n");
        res = -1;
      } else if (done_at != n - 1) {
        vec_buf_printf(diag,
                       "hr_rx_on_message reported DONE at message %d "
                       "of %d\n",
                       done_at, n);
        res = -1;
      }
    } else if (rc == 0) {
      vec_buf_printf(diag, "the whole sequence was accepted (expected %s)\n",
                     hr_wire_error_name((uint32_t)code));
      res = -1;
    } else {
      /* The offset of a finish-time error belongs to some earlier message:
       * bound it by the longest one. */
      size_t longest = 0;
      for (int i = 0; i < n; i++)
        longest = msgs[i].len > longest ? msgs[i].len : longest;
      if (check_rejection(rc, &st, code, longest, "hr_rx_finish", diag) != 0)
        res = -1;
    }
  }

  if (valid && logical != NULL && res == 0 &&
      vec_asm_check_logical(&as, logical, &cfg, diag) != 0)
    res = -1;

  vec_asm_free(&as);
  hr_rx_del(rx);
  free(msgs);
  return res;
}

static int check_vector(const char *file, const cJSON *v, vec_buf *diag) {
  (void)file;
  int ok = 1;
  const char *kind = vec_get_str(v, "kind", &ok);
  const char *hex = vec_get_str(v, "hex", &ok);
  hr_wire_ctx ctx;
  if (!ok || vec_transport(v, &ctx) != 0 ||
      (strcmp(kind, "valid") != 0 && strcmp(kind, "invalid") != 0)) {
    vec_buf_printf(diag, "vector: missing or bad kind/hex/transport\n");
    return -1;
  }
  uint8_t *p;
  size_t len;
  if (vec_hex_decode(hex, &p, &len) != 0) {
    vec_buf_printf(diag, "vector: `hex` is not hex\n");
    return -1;
  }
  int rc;
  if (cJSON_GetObjectItemCaseSensitive(v, "sequence") != NULL) {
    rc = check_sequence(v, p, len, &ctx, diag);
  } else if (strcmp(kind, "valid") == 0) {
    rc = check_single_valid(v, p, len, &ctx, diag);
  } else {
    rc = check_single_invalid(v, p, len, &ctx, diag);
  }
  free(p);
  return rc;
}

int main(void) {
  return vec_main("vectors_test", check_vector);
}
