/* Client helpers of the engine tests: see tc.h. */
#include "tc.h"

#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                               \
  do {                                                                         \
    if (!(x)) {                                                                \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);    \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static void on_conn(hr_conn *hc, int status, void *ud) {
  tc_conn *c = ud;
  const char *msg = NULL;

  if (status == 0 && !c->up) {
    c->up = 1;
    return;
  }
  c->closed = 1;
  c->status = status;
  hr_conn_error(hc, &c->wire_error, &c->wire_sent, &msg);
  snprintf(c->message, sizeof c->message, "%s", msg ? msg : "");
  c->c = NULL;
}

void tc_connect(tl_env *env, hr_engine *e, const char *url, tc_conn *c,
                const hr_settings *settings) {
  memset(c, 0, sizeof *c);
  c->env = env;
  c->e = e;
  CHECK(hr_engine_connect(e, url, settings, on_conn, c, &c->c) == 0);
}

static int up_or_closed(void *ud) {
  tc_conn *c = ud;
  return c->up || c->closed;
}

int tc_wait_up(tc_conn *c, int timeout_ms) {
  tl_run(c->env, up_or_closed, c, timeout_ms);
  return c->up && !c->closed;
}

void tc_open(tl_env *env, hr_engine *e, const char *url, tc_conn *c) {
  tc_connect(env, e, url, c, NULL);
  if (!tc_wait_up(c, 10000)) {
    fprintf(stderr, "connect to %s failed: %s %s\n", url,
            hr_strerror(c->status), c->message);
    abort();
  }
}

static int is_closed(void *ud) {
  return ((tc_conn *)ud)->closed;
}

int tc_wait_closed(tc_conn *c, int timeout_ms) {
  return tl_run(c->env, is_closed, c, timeout_ms);
}

void tc_close(tc_conn *c) {
  if (c->closed)
    return;
  hr_conn_close(c->c);
  CHECK(tc_wait_closed(c, 10000));
}

static void on_get(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  tc_res *r = ud;

  (void)s;
  (void)sid;
  CHECK(!r->done); /* exactly once */
  r->done = 1;
  r->t = t;
  if (rec)
    r->rec = *rec;
  r->status = rec ? rec->status : (t ? 0 : HR_ERR_CLOSED);
}

int tc_get_start(tc_conn *c, const hr_get_opts *o, tc_res *r, uint32_t *sid) {
  int rv;

  memset(r, 0, sizeof *r);
  rv = hr_session_get(hr_conn_session(c->c), o, on_get, r, sid);
  if (rv == 0)
    CHECK(hr_engine_flush(c->e) == 0);
  return rv;
}

static int res_done(void *ud) {
  return ((tc_res *)ud)->done;
}

int tc_wait(tc_conn *c, tc_res *r, int timeout_ms) {
  return tl_run(c->env, res_done, r, timeout_ms);
}

int tc_get(tc_conn *c, const hr_get_opts *o, tc_res *r) {
  int rv = tc_get_start(c, o, r, NULL);
  if (rv)
    return rv;
  CHECK(tc_wait(c, r, 30000));
  return r->status;
}

int tc_get_key(tc_conn *c, const char *key, tc_res *r) {
  hr_get_opts o;
  tc_opts(&o, key);
  return tc_get(c, &o, r);
}

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  tc_res *r = ud;

  (void)s;
  (void)sid;
  CHECK(!r->done);
  r->done = 1;
  if (rec)
    r->rec = *rec;
  r->status = rec ? rec->status : HR_ERR_CLOSED;
}

int tc_put_start(tc_conn *c, const char *key, uint32_t flags, hr_tensor *t,
                 tc_res *r) {
  int rv;

  memset(r, 0, sizeof *r);
  rv = hr_session_put(hr_conn_session(c->c), (const uint8_t *)key,
                      (uint16_t)strlen(key), flags, t, on_put, r, NULL);
  if (rv == 0)
    CHECK(hr_engine_flush(c->e) == 0);
  return rv;
}

int tc_put(tc_conn *c, const char *key, uint32_t flags, hr_tensor *t,
           tc_res *r) {
  int rv = tc_put_start(c, key, flags, t, r);

  if (rv)
    return rv;
  CHECK(tc_wait(c, r, 30000));
  return r->status;
}

static void on_list(hr_session *s, int status, uint32_t wire_error,
                    const hr_list_response *resp, void *ud) {
  tc_res *r = ud;
  hr_list_entry e;
  size_t pos = 0;

  (void)s;
  CHECK(!r->done);
  r->done = 1;
  r->status = status;
  r->wire_error = wire_error;
  if (status || !resp)
    return;
  r->more = resp->more;
  while (
      hr_list_entry_next(resp->entries_raw, resp->entries_raw_len, &pos, &e)) {
    CHECK(r->nentries < 64 && e.key_len < 64);
    memcpy(r->keys[r->nentries], e.key, e.key_len);
    r->keys[r->nentries][e.key_len] = '\0';
    r->entries[r->nentries] = e;
    r->entries[r->nentries].key = (const uint8_t *)r->keys[r->nentries];
    r->nentries++;
  }
}

int tc_list(tc_conn *c, const char *prefix, const char *start_after,
            uint16_t max, tc_res *r) {
  int rv;

  memset(r, 0, sizeof *r);
  rv = hr_session_list(hr_conn_session(c->c), (const uint8_t *)prefix,
                       (uint16_t)strlen(prefix), (const uint8_t *)start_after,
                       (uint16_t)strlen(start_after), max, on_list, r);
  if (rv)
    return rv;
  CHECK(hr_engine_flush(c->e) == 0);
  CHECK(tc_wait(c, r, 30000));
  return r->status;
}

static void on_ping(hr_session *s, int status, uint64_t rtt, void *ud) {
  tc_res *r = ud;

  (void)s;
  r->done = 1;
  r->status = status;
  r->rtt = rtt;
}

int tc_ping(tc_conn *c, tc_res *r) {
  int rv;

  memset(r, 0, sizeof *r);
  rv = hr_session_ping(hr_conn_session(c->c), on_ping, r);
  if (rv)
    return rv;
  CHECK(hr_engine_flush(c->e) == 0);
  CHECK(tc_wait(c, r, 30000));
  return r->status;
}

void tc_res_clear(tc_res *r) {
  hr_tensor_unref(r->t);
  r->t = NULL;
}
