/*
 * The blocking client: an engine on a private poll() loop, run on the
 * caller's thread until each call's completion arrived.
 *
 * Completions write into an `op` on the caller's stack, so a call never
 * returns while its session could still complete it: a timed-out request
 * is cancelled, and if the cancel is not answered within a grace period
 * the connection is cut (hr_conn_abort), which completes every stream.
 */
#include <hurray/client.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hr_bulk.h"
#include "hr_internal.h"
#include "hr_ploop.h"

#define CANCEL_GRACE_MS 1000
#define CLOSE_GRACE_MS 2000

struct hr_client {
  hr_mem mem;
  hr_client_options o;
  hr__ploop *loop;
  hr_engine *e;
  hr_conn *conn;            /* NULL once closed */
  int up;                   /* HELLOs exchanged */
  int closed;               /* the connection ended (close callback ran) */
  hr_client_error conn_err; /* why it ended */
  hr_client_error err;      /* the last call's */
  int engine_closed;
};

/* One call's completion. */
typedef struct op {
  int done;
  int status;
  hr_tensor *t;
  hr_transfer_record rec;
  int have_rec;
  /* LIST */
  int (*on_entry)(const hr_list_entry *e, void *ud);
  void *ud;
  int more;
  uint32_t wire_error;
  /* PING */
  uint64_t rtt;
} op;

void hr_client_options_default(hr_client_options *o) {
  memset(o, 0, sizeof *o);
  o->version = HR_CLIENT_OPTIONS_VERSION;
  hr_settings_default(&o->settings);
  o->timeout_ms = 30000;
  o->progress_interval_ms = 100;
}

/* Copies a text, cut to fit (a cut message is still useful). */
static void copy_text(char *dst, size_t cap, const char *src) {
  size_t n = src ? strlen(src) : 0;

  if (n >= cap)
    n = cap - 1;
  if (n)
    memcpy(dst, src, n);
  dst[n] = '\0';
}

static void conn_cb(hr_conn *c, int status, void *ud) {
  hr_client *cl = ud;
  const char *msg;

  if (status == 0 && !cl->up) {
    cl->up = 1;
    return;
  }
  cl->closed = 1;
  cl->conn_err.status = status;
  hr_conn_error(c, &cl->conn_err.wire_error, &cl->conn_err.wire_error_sent,
                &msg);
  copy_text(cl->conn_err.message, sizeof cl->conn_err.message, msg);
  cl->conn = NULL; /* invalid once this callback returns */
}

static void set_err(hr_client *cl, int status, uint32_t wire_error, int sent,
                    const char *message) {
  cl->err.status = status;
  cl->err.wire_error = wire_error;
  cl->err.wire_error_sent = sent;
  copy_text(cl->err.message, sizeof cl->err.message, message);
}

/* Records `rv` with `message` as the last error and returns it. */
static int failed(hr_client *cl, int rv, const char *message) {
  set_err(cl, rv, 0, 0, message);
  return rv;
}

/* A call's error: its own record, or the connection's when the call only
 * saw the connection end. */
static int finish(hr_client *cl, int status, const hr_transfer_record *rec) {
  if (status == 0) {
    set_err(cl, 0, 0, 0, NULL);
    return 0;
  }
  if ((status == HR_ERR_CLOSED || (rec && !rec->wire_error)) && cl->closed &&
      cl->conn_err.status && cl->conn_err.status != HR_ERR_CLOSED) {
    cl->err = cl->conn_err;
    return cl->err.status;
  }
  if (rec)
    set_err(cl, status, rec->wire_error, rec->wire_error_sent, rec->message);
  else
    set_err(cl, status, 0, 0, hr_strerror(status));
  return status;
}

static int is_done(void *ud) {
  return ((op *)ud)->done;
}

/* Runs the loop until done(ud) or the timeout (the predicates cover the
 * connection's end: its teardown completes every stream first).  Returns
 * 0 (done), HR_ERR_TIMEOUT, HR_ERR_IO or a fatal error. */
static int run_until(hr_client *cl, int (*done)(void *), void *ud,
                     int64_t timeout_ms) {
  hr_tstamp now = hr__ploop_now();
  hr_tstamp deadline =
      timeout_ms < 0 ? HR_TSTAMP_NEVER : now + (hr_tstamp)timeout_ms * 1000000u;
  hr_tstamp next_progress =
      now + (hr_tstamp)cl->o.progress_interval_ms * 1000000u;
  int rv;

  while (!done(ud)) {
    int wait = -1;
    now = hr__ploop_now();
    if (now >= deadline)
      return HR_ERR_TIMEOUT;
    if (deadline != HR_TSTAMP_NEVER) {
      uint64_t ms = (deadline - now + 999999u) / 1000000u;
      wait = ms > 1000000 ? 1000000 : (int)ms;
    }
    if (cl->o.on_progress && cl->o.progress_interval_ms > 0 &&
        (wait < 0 || wait > cl->o.progress_interval_ms))
      wait = cl->o.progress_interval_ms;
    rv = hr__ploop_step(cl->loop, wait);
    if (hr_err_is_fatal(rv) || rv == HR_ERR_IO)
      return rv;
    if (cl->o.on_progress && cl->conn) {
      now = hr__ploop_now();
      if (now >= next_progress) {
        uint64_t rx, tx;
        hr_conn_bytes(cl->conn, &rx, &tx);
        cl->o.on_progress(rx, tx, cl->o.user_data);
        next_progress = now + (hr_tstamp)cl->o.progress_interval_ms * 1000000u;
      }
    }
  }
  return 0;
}

static int is_closed(void *ud) {
  return ((hr_client *)ud)->closed;
}

/* Cuts the connection and waits for its close (the loop delivers it on
 * the next turn). */
static void cut(hr_client *cl) {
  if (!cl->conn)
    return;
  hr_conn_abort(cl->conn);
  run_until(cl, is_closed, cl, CLOSE_GRACE_MS);
}

/* Waits for `o`, cancelling stream `sid` (when non-zero) on timeout.
 * Always returns with o->done set. */
static int wait_op(hr_client *cl, op *o, uint32_t sid) {
  int rv;

  hr_engine_flush(cl->e);
  rv = run_until(cl, is_done, o, cl->o.timeout_ms);
  if (rv == 0)
    return 0;
  if (rv == HR_ERR_TIMEOUT && sid && cl->conn) {
    hr_session_cancel(hr_conn_session(cl->conn), sid);
    hr_engine_flush(cl->e);
    run_until(cl, is_done, o, CANCEL_GRACE_MS);
  }
  if (!o->done)
    cut(cl);
  /* A device PUT's callback waits for its staging copies in flight
   * (they end on the device); `o` lives on this frame until it came. */
  if (!o->done)
    run_until(cl, is_done, o, -1);
  /* Teardown completes every stream; nothing else can be left. */
  return rv;
}

int hr_client_connect(hr_client **out, const char *url,
                      const hr_client_options *opts, const hr_mem *mem,
                      hr_client_error *err) {
  hr_client *cl;
  hr_engine_config cfg;
  hr_loop_ops ops;
  long ncpu;
  int rv;

  if (err)
    memset(err, 0, sizeof *err);
  if (!out || !url || (opts && opts->version != HR_CLIENT_OPTIONS_VERSION)) {
    if (err)
      err->status = HR_ERR_INVALID_ARGUMENT;
    return HR_ERR_INVALID_ARGUMENT;
  }
  if (!mem)
    mem = hr_mem_default();
  cl = hr__mem_calloc(mem, 1, sizeof *cl);
  if (!cl)
    return HR_ERR_NOMEM;
  cl->mem = *mem;
  if (opts)
    cl->o = *opts;
  else
    hr_client_options_default(&cl->o);
  if (cl->o.progress_interval_ms <= 0)
    cl->o.progress_interval_ms = 100;
  rv = hr__ploop_new(&cl->loop, mem);
  if (rv)
    goto fail;
  hr_engine_config_default(&cfg);
  cfg.session = cl->o.settings;
  if (cl->o.tls) {
    /* Load it here first: the engine's failure has no message. */
    rv = hr_tls_config_check(cl->o.tls, 0, cl->err.message,
                             sizeof cl->err.message);
    if (rv) {
      cl->err.status = rv;
      goto fail;
    }
    cfg.tls_client = cl->o.tls;
  }
  /* A worker per lane, up to the CPUs: each lane's bulk reads (and a
   * PUT's writes) run on a thread of their own, so that lanes use as many
   * cores; more threads than cores would only take turns (a job that
   * would wait yields to queued ones, so fewer threads serve all lanes). */
  ncpu = hr__bulk_cpus(); /* affinity, capped by the cgroup quota */
  {
    unsigned lanes = cl->o.lanes > 1 ? cl->o.lanes : 1;
    cfg.worker_threads =
        ncpu >= 1 && (unsigned long)ncpu < lanes ? (unsigned)ncpu : lanes;
  }
  cfg.bulk_offload_min = cl->o.bulk_offload_min;
  cfg.bulk_offload_lone = cl->o.bulk_offload_lone;
  cfg.bulk_offload_jobs = cl->o.bulk_offload_jobs;
  cfg.fabric_provider = cl->o.fabric_provider;
  cfg.fabric_node = cl->o.fabric_node;
  cfg.fabric_caps = cl->o.fabric_caps;
  cfg.shm_map_cache = cl->o.shm_map_cache;
  if (cl->o.timeout_ms > 0)
    cfg.drain_timeout = (uint64_t)cl->o.timeout_ms * 1000000u;
  hr__ploop_ops(&ops);
  /* The engine sizes its bulk jobs by the same count: the cgroup files
   * are read once per connect. */
  rv = hr__engine_new_cpus(&cl->e, &ops, cl->loop, &cfg, mem, ncpu);
  if (rv) {
    char m[300];
    snprintf(m, sizeof m, "cannot start the engine%s: %s",
             cfg.fabric_provider ? " (opening the RDMA fabric)" : "",
             hr_strerror(rv));
    set_err(cl, rv, 0, 0, m);
    goto fail;
  }
  hr__ploop_set_engine(cl->loop, cl->e);
  rv = hr_engine_connect_group(cl->e, url, cl->o.lanes ? cl->o.lanes : 1,
                               NULL, conn_cb, cl, &cl->conn);
  if (rv) {
    char m[300];
    snprintf(m, sizeof m, "cannot connect to %s: %s", url, hr_strerror(rv));
    set_err(cl, rv, 0, 0, m);
    goto fail;
  }
  if (cl->o.on_rx || cl->o.on_tx)
    hr_conn_set_tap(cl->conn, cl->o.on_rx, cl->o.on_tx, cl->o.user_data);
  {
    /* Wait for the HELLOs or the end. */
    hr_tstamp deadline =
        cl->o.timeout_ms < 0
            ? HR_TSTAMP_NEVER
            : hr__ploop_now() + (hr_tstamp)cl->o.timeout_ms * 1000000u;
    rv = 0;
    while (!cl->up && !cl->closed) {
      hr_tstamp now = hr__ploop_now();
      int wait;
      if (now >= deadline) {
        rv = HR_ERR_TIMEOUT;
        break;
      }
      wait = deadline == HR_TSTAMP_NEVER
                 ? -1
                 : (int)((deadline - now + 999999u) / 1000000u);
      rv = hr__ploop_step(cl->loop, wait);
      if (rv)
        break;
    }
  }
  if (!cl->up) {
    if (rv == HR_ERR_TIMEOUT) {
      set_err(cl, rv, 0, 0, "no answer to the HELLO in time");
      cut(cl);
    } else if (cl->closed) {
      cl->err = cl->conn_err;
      rv = cl->err.status ? cl->err.status : HR_ERR_CLOSED;
      cl->err.status = rv;
      if (!cl->err.message[0])
        snprintf(cl->err.message, sizeof cl->err.message,
                 "the server closed the connection");
    } else {
      set_err(cl, rv, 0, 0, hr_strerror(rv));
      cut(cl);
    }
    goto fail;
  }
  set_err(cl, 0, 0, 0, NULL);
  *out = cl;
  return 0;
fail:
  if (err)
    *err = cl->err;
  if (!rv)
    rv = HR_ERR_INTERNAL;
  if (cl->e && hr_engine_del(cl->e) != 0) {
    /* Cannot happen: every path above ended the connection. */
    return rv;
  }
  hr__ploop_del(cl->loop);
  hr__mem_free(mem, cl);
  return rv;
}

int hr_client_tls_info(const hr_client *c, hr_tls_info *out) {
  if (!c || !out)
    return HR_ERR_INVALID_ARGUMENT;
  if (!c->conn)
    return HR_ERR_CLOSED;
  return hr_conn_tls_info(c->conn, out);
}

static hr_session *live_session(hr_client *cl) {
  if (!cl->conn) {
    cl->err = cl->conn_err;
    if (!cl->err.status)
      cl->err.status = HR_ERR_CLOSED;
    return NULL;
  }
  return hr_conn_session(cl->conn);
}

static void on_get(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  op *o = ud;

  (void)s;
  (void)sid;
  o->done = 1;
  o->t = t;
  if (rec) {
    o->rec = *rec;
    o->have_rec = 1;
  }
  o->status = rec ? rec->status : (t ? 0 : HR_ERR_CLOSED);
  if (o->status == 0 && !t)
    o->status = HR_ERR_INTERNAL;
}

int hr_client_get(hr_client *c, const hr_get_opts *opts, hr_tensor **out,
                  hr_transfer_record *rec) {
  hr_session *s;
  uint32_t sid = 0;
  op o;
  int rv;

  if (!c || !opts || !out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  memset(&o, 0, sizeof o);
  s = live_session(c);
  if (!s)
    return c->err.status;
  rv = hr_session_get(s, opts, on_get, &o, &sid);
  if (rv)
    return failed(c, rv, hr_strerror(rv));
  rv = wait_op(c, &o, sid);
  if (rec)
    *rec = o.rec;
  if (rv == HR_ERR_TIMEOUT) {
    hr_tensor_unref(o.t);
    return failed(c, rv, "the request timed out");
  }
  if (o.status) {
    hr_tensor_unref(o.t);
    return finish(c, o.status, o.have_rec ? &o.rec : NULL);
  }
  *out = o.t;
  return finish(c, 0, NULL);
}

/* The LIST entry of exactly one key. */
typedef struct shape_probe {
  const uint8_t *key;
  uint16_t key_len;
  int found;
  uint8_t rank;
  uint64_t shape[HR_MAX_RANK];
} shape_probe;

static int probe_shape(const hr_list_entry *e, void *ud) {
  shape_probe *p = ud;

  if (e->key_len == p->key_len && !memcmp(e->key, p->key, e->key_len)) {
    p->found = 1;
    p->rank = e->rank;
    memcpy(p->shape, e->shape, sizeof p->shape);
  }
  return 1;
}

int hr_client_get_slice(hr_client *c, const uint8_t *key, uint16_t key_len,
                        unsigned dim, uint32_t index, uint32_t count,
                        const hr_get_opts *opts, hr_tensor **out,
                        hr_transfer_record *rec) {
  const hr_hello *h;
  shape_probe p;
  hr_get_opts o;
  uint64_t off[HR_MAX_RANK], ext[HR_MAX_RANK];
  int rv;

  if (!c || !key || !key_len || !out || count == 0 || index >= count)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  h = hr_client_server_hello(c);
  if (h && (!(h->capability_flags & HR_CAP_LIST) ||
            !(h->capability_flags & HR_CAP_REGION_REQUESTS))) {
    set_err(c, HR_ERR_UNSUPPORTED, 0, 0,
            "the server offers no LIST or no REGION requests");
    return HR_ERR_UNSUPPORTED;
  }
  /* The key is the smallest key with itself as prefix: a page of one
   * entry names it when it exists. */
  memset(&p, 0, sizeof p);
  p.key = key;
  p.key_len = key_len;
  rv = hr_client_list(c, key, key_len, NULL, 0, 1, probe_shape, &p, NULL,
                      NULL);
  if (rv)
    return rv;
  if (!p.found) {
    set_err(c, HR_ERR_NOT_FOUND, HR_WIRE_NOT_FOUND, 0, "no such tensor");
    return HR_ERR_NOT_FOUND;
  }
  rv = hr_region_slice(p.rank, p.shape, dim, index, count, off, ext);
  if (rv)
    return failed(c, rv,
                  "no such slice of this tensor (rank 0, or dim beyond its "
                  "rank)");
  if (opts)
    o = *opts;
  else
    memset(&o, 0, sizeof o);
  o.key = key;
  o.key_len = key_len;
  o.flags |= HR_REQ_REGION;
  o.region_rank = p.rank;
  o.region_offset = off;
  o.region_shape = ext;
  if ((o.flags & HR_REQ_PARALLEL_OK) && o.max_shards == 0)
    o.max_shards = 1;
  return hr_client_get(c, &o, out, rec);
}

static void on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
                   void *ud) {
  op *o = ud;

  (void)s;
  (void)sid;
  o->done = 1;
  if (rec) {
    o->rec = *rec;
    o->have_rec = 1;
  }
  o->status = rec ? rec->status : HR_ERR_CLOSED;
}

int hr_client_put(hr_client *c, const uint8_t *key, uint16_t key_len,
                  uint32_t flags, hr_tensor *t, hr_transfer_record *rec) {
  hr_session *s;
  uint32_t sid = 0;
  op o;
  int rv;

  if (!c || !key || !t)
    return HR_ERR_INVALID_ARGUMENT;
  memset(&o, 0, sizeof o);
  s = live_session(c);
  if (!s)
    return c->err.status;
  rv = hr_session_put(s, key, key_len, flags, t, on_put, &o, &sid);
  if (rv)
    return failed(c, rv, hr_strerror(rv));
  rv = wait_op(c, &o, sid);
  if (rec)
    *rec = o.rec;
  if (rv == HR_ERR_TIMEOUT)
    return failed(c, rv, "the request timed out");
  return finish(c, o.status, o.have_rec ? &o.rec : NULL);
}

static void on_list(hr_session *s, int status, uint32_t wire_error,
                    const hr_list_response *resp, void *ud) {
  op *o = ud;
  hr_list_entry e;
  size_t pos = 0;

  (void)s;
  o->done = 1;
  o->status = status;
  o->wire_error = wire_error;
  if (status == 0 && resp) {
    o->more = resp->more;
    while (
        hr_list_entry_next(resp->entries_raw, resp->entries_raw_len, &pos, &e))
      if (o->on_entry && o->on_entry(&e, o->ud))
        break;
  }
}

int hr_client_list(hr_client *c, const uint8_t *prefix, uint16_t prefix_len,
                   const uint8_t *start_after, uint16_t start_after_len,
                   uint16_t max_entries,
                   int (*on_entry)(const hr_list_entry *e, void *user_data),
                   void *user_data, int *more, uint32_t *wire_error) {
  hr_session *s;
  op o;
  int rv;

  if (!c)
    return HR_ERR_INVALID_ARGUMENT;
  memset(&o, 0, sizeof o);
  o.on_entry = on_entry;
  o.ud = user_data;
  s = live_session(c);
  if (!s)
    return c->err.status;
  rv = hr_session_list(s, prefix, prefix_len, start_after, start_after_len,
                       max_entries, on_list, &o);
  if (rv)
    return failed(c, rv, hr_strerror(rv));
  /* LIST has no stream id to cancel: a timeout cuts the connection. */
  rv = wait_op(c, &o, 0);
  if (more)
    *more = o.more;
  if (wire_error)
    *wire_error = o.wire_error;
  if (rv == HR_ERR_TIMEOUT)
    return failed(c, rv, "the request timed out");
  if (o.status) {
    hr_transfer_record r;
    memset(&r, 0, sizeof r);
    r.status = o.status;
    r.wire_error = o.wire_error;
    return finish(c, o.status, o.wire_error ? &r : NULL);
  }
  return finish(c, 0, NULL);
}

static void on_ping(hr_session *s, int status, uint64_t rtt, void *ud) {
  op *o = ud;

  (void)s;
  o->done = 1;
  o->status = status;
  o->rtt = rtt;
}

int hr_client_ping(hr_client *c, uint64_t *rtt_ns) {
  hr_session *s;
  op o;
  int rv;

  if (!c)
    return HR_ERR_INVALID_ARGUMENT;
  memset(&o, 0, sizeof o);
  s = live_session(c);
  if (!s)
    return c->err.status;
  rv = hr_session_ping(s, on_ping, &o);
  if (rv)
    return failed(c, rv, hr_strerror(rv));
  rv = wait_op(c, &o, 0);
  if (rv == HR_ERR_TIMEOUT)
    return failed(c, rv, "the PING timed out");
  if (rtt_ns)
    *rtt_ns = o.rtt;
  return finish(c, o.status, NULL);
}

typedef struct user_wait {
  hr_client *cl;
  int (*done)(void *);
  void *ud;
} user_wait;

static int user_done(void *p) {
  user_wait *w = p;
  return w->done(w->ud) || w->cl->closed;
}

int hr_client_wait(hr_client *c, int (*done)(void *user_data), void *user_data,
                   int64_t timeout_ms) {
  user_wait w;
  int rv;

  if (!c || !done)
    return HR_ERR_INVALID_ARGUMENT;
  w.cl = c;
  w.done = done;
  w.ud = user_data;
  hr_engine_flush(c->e);
  rv = run_until(c, user_done, &w, timeout_ms);
  if (rv == 0 && !done(user_data))
    rv = HR_ERR_CLOSED;
  return rv;
}

hr_session *hr_client_session(hr_client *c) {
  return c && c->conn ? hr_conn_session(c->conn) : NULL;
}

unsigned hr_client_lanes(const hr_client *c) {
  return c && c->conn ? hr_conn_lanes(c->conn) : 0;
}

const hr_hello *hr_client_server_hello(const hr_client *c) {
  return c && c->conn ? hr_session_peer_hello(hr_conn_session(c->conn)) : NULL;
}

const hr_client_error *hr_client_last_error(const hr_client *c) {
  return c ? &c->err : NULL;
}

static void on_engine_closed(hr_engine *e, void *ud) {
  (void)e;
  ((hr_client *)ud)->engine_closed = 1;
}

static int is_engine_closed(void *ud) {
  return ((hr_client *)ud)->engine_closed;
}

void hr_client_close(hr_client *c) {
  hr_mem mem;

  if (!c)
    return;
  if (hr_engine_close(c->e, on_engine_closed, c) == 0)
    run_until(c, is_engine_closed, c,
              c->o.timeout_ms < 0 ? CLOSE_GRACE_MS : c->o.timeout_ms);
  if (!c->engine_closed) {
    cut(c);
    run_until(c, is_engine_closed, c, CLOSE_GRACE_MS);
  }
  /* Every connection is gone: the engine can go. */
  hr_engine_del(c->e);
  hr__ploop_del(c->loop);
  mem = c->mem;
  hr__mem_free(&mem, c);
}
