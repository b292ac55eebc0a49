/*
 * The in-process server/client pair (<hurray/inproc.h>).
 *
 * Each engine taking part gets a mailbox (its engine extension,
 * engine/io/hr_engine_ext.h): other threads append operations under a
 * mutex and call hr_engine_wakeup(); the engine runs them on its loop
 * thread.  A request is one allocation (`req`) that travels as an
 * operation to the server's mailbox, is answered there, and travels back
 * to the client's mailbox, where its callback runs and it is freed.  So
 * every request is answered exactly once, also when the connection or
 * the server closed in between (then with HR_ERR_CLOSED).
 *
 * Zero copy: a GET's answer (`share`) holds the server's reference on the
 * provider's tensor; the client's tensor wraps the same buffers with a
 * release that makes the hub ledger's buffer release once, which posts
 * the reference's drop back to the server's mailbox.  A PUT is the mirror
 * image.  After an engine was freed its mailbox runs what is posted to it
 * on the posting thread instead (only releases and late answers can
 * arrive then).
 */
#include <hurray/inproc.h>

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "hr_engine_ext.h"
#include "hr_inproc_names.h"
#include "hr_inproc_int.h"
#include "hr_internal.h"
#include "hr_local_get.h"

#ifdef HR_HAVE_TRANSCODE
#include <hurray/transcode.h>
#endif

#define container_of(p, T, m) ((T *)(void *)((char *)(p)-offsetof(T, m)))

/* ------------------------------------------------------------------------ */
/* Mailboxes                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct op op;
struct op {
  op *next;
  /* gone: the engine was freed and this runs on the posting thread. */
  void (*fn)(op *o, int gone);
};

typedef struct box {
  hr__engine_ext ext; /* first: the engine's slot points here */
  hr_mem mem;
  pthread_mutex_t mu;
  hr_engine *e; /* NULL once detached */
  op *head, *tail;
  unsigned users; /* servers and connections open on the engine */
  unsigned refs;  /* the engine's, and every holder's */
} box;

static void box_unref(box *b) {
  unsigned left;
  pthread_mutex_lock(&b->mu);
  left = --b->refs;
  pthread_mutex_unlock(&b->mu);
  if (left == 0) {
    hr_mem mem = b->mem;
    pthread_mutex_destroy(&b->mu);
    hr__mem_free(&mem, b);
  }
}

static void box_ref(box *b) {
  pthread_mutex_lock(&b->mu);
  b->refs++;
  pthread_mutex_unlock(&b->mu);
}

static void box_post(box *b, op *o) {
  int queued = 0;
  o->next = NULL;
  pthread_mutex_lock(&b->mu);
  if (b->e) {
    if (b->tail)
      b->tail->next = o;
    else
      b->head = o;
    b->tail = o;
    /* Inside the lock: detach clears b->e under it, so the engine is
     * alive for this call. */
    hr_engine_wakeup(b->e);
    queued = 1;
  }
  pthread_mutex_unlock(&b->mu);
  if (!queued)
    o->fn(o, 1);
}

static void box_run(hr__engine_ext *x) {
  box *b = (box *)x;
  op *list, *o;
  pthread_mutex_lock(&b->mu);
  list = b->head;
  b->head = b->tail = NULL;
  pthread_mutex_unlock(&b->mu);
  while ((o = list)) {
    list = o->next;
    o->fn(o, 0);
  }
}

static int box_busy(hr__engine_ext *x) {
  box *b = (box *)x;
  unsigned u;
  pthread_mutex_lock(&b->mu);
  u = b->users;
  pthread_mutex_unlock(&b->mu);
  return u != 0;
}

static void box_detach(hr__engine_ext *x) {
  box *b = (box *)x;
  op *list, *o;
  pthread_mutex_lock(&b->mu);
  b->e = NULL;
  list = b->head;
  b->head = b->tail = NULL;
  pthread_mutex_unlock(&b->mu);
  while ((o = list)) {
    list = o->next;
    o->fn(o, 1);
  }
  box_unref(b);
}

/* The mailbox of engine `e` (created on first use; loop thread), with a
 * reference and a user counted for the caller. */
static box *box_use(hr_engine *e, const hr_mem *mem) {
  hr__engine_ext **slot = hr__engine_ext_slot(e);
  box *b;
  if (*slot) {
    b = (box *)*slot;
  } else {
    b = hr__mem_calloc(mem, 1, sizeof *b);
    if (!b)
      return NULL;
    b->ext.run = box_run;
    b->ext.busy = box_busy;
    b->ext.detach = box_detach;
    b->mem = *mem;
    b->e = e;
    b->refs = 1; /* the engine's */
    pthread_mutex_init(&b->mu, NULL);
    *slot = &b->ext;
  }
  pthread_mutex_lock(&b->mu);
  b->refs++;
  b->users++;
  pthread_mutex_unlock(&b->mu);
  return b;
}

static void box_unuse(box *b) {
  pthread_mutex_lock(&b->mu);
  b->users--;
  pthread_mutex_unlock(&b->mu);
}

/* ------------------------------------------------------------------------ */
/* Objects                                                                   */
/* ------------------------------------------------------------------------ */

struct hr_inproc_hub {
  /* First: engines configured with the hub (hr_engine_config.inproc_hub)
   * find their "inproc:NAME" listeners here.  Servers claim their names in
   * it too, so that a name is either an engine's listener or a server. */
  hr__inproc_names names;
  hr_mem mem;
  pthread_mutex_t mu;
  hr_inproc_server *servers; /* open ones, by name */
  unsigned objects;          /* servers and connections not freed yet */
  hr_handoff_ledger *ledger;
};

typedef struct req req;

struct hr_inproc_server {
  hr_inproc_hub *hub;
  box *b;
  hr_provider prov;
  char name[256];
  hr_session *ds; /* the session handed to the provider */
  int closed;     /* loop thread */
  req *gets;      /* GETs not answered yet (loop thread) */
  req *in_on_get; /* the GET whose on_get runs now (loop thread) */
  int answered_in_on_get;
  unsigned refs; /* atomic: the application's, and each connection's */
  hr_inproc_server *next;
};

struct hr_inproc_conn {
  hr_inproc_hub *hub;
  box *b;              /* the client engine's */
  hr_inproc_server *s; /* a reference */
  int closed;          /* loop thread */
  uint32_t next_sid;
  req *reqs; /* not completed yet (loop thread) */
  size_t npending;
  unsigned refs; /* atomic: the application's and each request's */
};

enum { K_GET, K_PUT, K_LIST };

/* One shared tensor: the holder's reference, dropped by the handoff's
 * buffer release on the holder's loop thread. */
typedef struct share {
  op o;         /* the drop, posted to `home` */
  box *home;    /* where the tensor's owner lives (a reference) */
  hr_tensor *t; /* the owner's reference */
  hr_handoff *h;
  hr_mem mem;
  unsigned members_left; /* composite: member wraps not released yet */
} share;

struct req {
  op o; /* to the server, then back to the client */
  int kind;
  hr_inproc_conn *c;
  req *prev, *next; /* c->reqs, then (server) s->gets */
  uint32_t sid;
  int done; /* the callback ran (or the close completed it) */
  int answered;
  void *ud;
  hr_get_cb gcb;
  hr_put_cb pcb;
  hr_list_cb lcb;
  uint8_t *blob; /* copies of keys, prefixes and layout profiles */
  /* GET */
  hr_srv_get g; /* the provider's handle (g.local set) */
  hr_get_info info;
  hr_request rq;
  /* PUT */
  hr_tensor *put_t; /* the client's reference */
  uint32_t put_flags;
  /* LIST */
  hr_list_request lr;
  /* The answer. */
  int status;
  uint32_t wire;
  char msg[256];
  hr_tensor *sh_t; /* GET: the client's tensor over the server's buffers */
  int transcoded;
  uint8_t *list_raw;
  size_t list_len, list_cap;
  uint16_t list_count;
  int list_more;
  hr_tstamp started;
};

_Static_assert(offsetof(struct hr_inproc_hub, names) == 0,
               "engines find the name table at the hub's address");

static hr_tstamp mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (hr_tstamp)ts.tv_sec * 1000000000ull + (hr_tstamp)ts.tv_nsec;
}

static void hub_forget(hr_inproc_hub *h) {
  pthread_mutex_lock(&h->mu);
  h->objects--;
  pthread_mutex_unlock(&h->mu);
}

static void srv_unref(hr_inproc_server *s) {
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  hr_inproc_hub *h = s->hub;
  hr_session_del(s->ds);
  box_unref(s->b);
  hr__mem_free(&h->mem, s);
  hub_forget(h);
}

static void conn_unref(hr_inproc_conn *c) {
  if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  hr_inproc_hub *h = c->hub;
  srv_unref(c->s);
  box_unref(c->b);
  hr__mem_free(&h->mem, c);
  hub_forget(h);
}

/* ------------------------------------------------------------------------ */
/* Hub                                                                       */
/* ------------------------------------------------------------------------ */

int hr_inproc_hub_new(hr_inproc_hub **out, const hr_mem *mem) {
  hr_inproc_hub *h;
  int rv;
  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!mem)
    mem = hr_mem_default();
  h = hr__mem_calloc(mem, 1, sizeof *h);
  if (!h)
    return HR_ERR_NOMEM;
  h->mem = *mem;
  rv = hr_handoff_ledger_new(&h->ledger, mem);
  if (rv) {
    hr__mem_free(mem, h);
    return rv;
  }
  rv = hr__inproc_names_init(&h->names, mem);
  if (rv) {
    hr_handoff_ledger_del(h->ledger, NULL);
    hr__mem_free(mem, h);
    return rv;
  }
  pthread_mutex_init(&h->mu, NULL);
  *out = h;
  return 0;
}

void hr_inproc_hub_counts(hr_inproc_hub *h, hr_handoff_counts *c) {
  if (h && c)
    hr_handoff_ledger_counts(h->ledger, c);
}

int hr_inproc_hub_del(hr_inproc_hub *h, hr_handoff_counts *final) {
  hr_handoff_counts c;
  unsigned objects;
  int rv;
  if (!h)
    return 0;
  pthread_mutex_lock(&h->mu);
  objects = h->objects;
  pthread_mutex_unlock(&h->mu);
  hr_handoff_ledger_counts(h->ledger, &c);
  if (objects || c.live || hr__inproc_names_count(&h->names))
    return HR_ERR_BUSY;
  rv = hr_handoff_ledger_del(h->ledger, final);
  hr__inproc_names_fini(&h->names);
  pthread_mutex_destroy(&h->mu);
  hr__mem_free(&h->mem, h);
  return rv;
}

/* ------------------------------------------------------------------------ */
/* Sharing a tensor by reference                                             */
/* ------------------------------------------------------------------------ */

static void share_drop(op *o, int gone) {
  share *sh = container_of(o, share, o);
  (void)gone;
  hr_tensor_unref(sh->t);
  box_unref(sh->home);
  hr__mem_free(&sh->mem, sh);
}

/* The handoff's buffer release: the drop goes home. */
static void share_release_home(void *ctx) {
  share *sh = ctx;
  sh->o.fn = share_drop;
  box_post(sh->home, &sh->o);
}

/* The receiver's release (its wrap's release callback; exactly once per
 * wrap, since hr_tensor calls it once). */
static void share_receiver_done(void *ctx) {
  share *sh = ctx;
  hr_handoff *h = sh->h;
  /* `sh` may be freed by the home thread as soon as the release is
   * posted: only `h` is used afterwards. */
  hr_handoff_release_buffer(h);
  hr_handoff_del(h);
}

static void share_member_done(void *ctx) {
  share *sh = ctx;
  if (__atomic_sub_fetch(&sh->members_left, 1, __ATOMIC_ACQ_REL) == 0)
    share_receiver_done(sh);
}

static const hr_buffer_handle *first_handle(hr_tensor *t) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    for (size_t i = 0; i < hr_tensor_member_count(t); i++) {
      const hr_descriptor *md = hr_tensor_descriptor(hr_tensor_member(t, i));
      if (md->buffer_count)
        return &md->buffers[0];
    }
    return NULL;
  }
  return d->buffer_count ? &d->buffers[0] : NULL;
}

/* Every buffer handle of `t` PRODUCER_SYNCED: the only mode a tensor
 * without a payload can be in (ADR-018 § 4). */
static int all_synced(hr_tensor *t) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  if (d->layout.tag == HR_LAYOUT_COMPOSITE) {
    for (size_t i = 0; i < hr_tensor_member_count(t); i++)
      if (!all_synced(hr_tensor_member(t, i)))
        return 0;
    return 1;
  }
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (d->buffers[k].sync_mode != HR_SYNC_PRODUCER_SYNCED)
      return 0;
  return 1;
}

static uint8_t device_of(hr_tensor *t) {
  const hr_buffer_handle *b = first_handle(t);
  return b ? b->device_tag : HR_DEV_CPU;
}

static unsigned leaves_of(hr_tensor *t) {
  unsigned n = 0;
  if (hr_tensor_descriptor(t)->layout.tag != HR_LAYOUT_COMPOSITE)
    return 1;
  for (size_t i = 0; i < hr_tensor_member_count(t); i++)
    n += leaves_of(hr_tensor_member(t, i));
  return n;
}

/* A tensor with the shape of `t` over its buffers: each leaf a wrap whose
 * release counts down sh->members_left; composites rebuilt around them.
 * On failure the leaves not wrapped are counted down here, and those
 * wrapped are counted down as their wraps go. */
static int wrap_tree(share *sh, hr_tensor *t, hr_tensor **out,
                     hr_wire_status *st) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  hr_tensor **wraps;
  size_t n, i;
  int rv = 0;

  if (d->layout.tag != HR_LAYOUT_COMPOSITE) {
    void *bufs[HR_MAX_BUFFERS];
    for (unsigned k = 0; k < d->buffer_count; k++)
      bufs[k] = hr_tensor_buffer(t, k);
    rv = hr_tensor_wrap(out, d, bufs, share_member_done, sh, &sh->mem);
    if (rv)
      share_member_done(sh);
    return rv;
  }
  n = hr_tensor_member_count(t);
  wraps = hr__mem_calloc(&sh->mem, n ? n : 1, sizeof *wraps);
  if (!wraps) {
    for (unsigned k = leaves_of(t); k; k--)
      share_member_done(sh);
    return HR_ERR_NOMEM;
  }
  for (i = 0; i < n; i++) {
    rv = wrap_tree(sh, hr_tensor_member(t, i), &wraps[i], st);
    if (rv) {
      for (size_t j = i + 1; j < n; j++)
        for (unsigned k = leaves_of(hr_tensor_member(t, j)); k; k--)
          share_member_done(sh);
      break;
    }
  }
  if (rv == 0)
    rv = hr_tensor_new_composite(out, d, wraps, n, &sh->mem, st);
  for (size_t j = 0; j < n; j++)
    hr_tensor_unref(wraps[j]);
  hr__mem_free(&sh->mem, wraps);
  return rv;
}

/*
 * Makes `t` (a reference is taken) shared with a receiver: records the
 * handoff in the hub's ledger and returns in *out a tensor over the same
 * buffers whose last drop releases it (a composite's when its last member
 * goes), the drop of `t` then running on `home`.  Returns 0, HR_ERR_PROTO
 * (st), HR_ERR_NOMEM.
 */
static int share_new(hr_inproc_hub *hub, box *home, hr_tensor *t,
                     hr_tensor **out, hr_wire_status *st) {
  hr_buffer_handle b;
  hr_handoff_request rq;
  hr_handoff_payload p;
  share *sh;
  int rv;

  *out = NULL;
  /* Described as the channel describes what it carries (P1: no payload
   * beyond the buffer release). */
  rv = hr__inproc_describe(t, NULL, &b, &p, st);
  if (rv)
    return rv;
  sh = hr__mem_calloc(&hub->mem, 1, sizeof *sh);
  if (!sh)
    return HR_ERR_NOMEM;
  sh->mem = hub->mem;
  sh->home = home;
  box_ref(home);
  sh->t = hr_tensor_ref(t);
  sh->members_left = leaves_of(t);
  memset(&rq, 0, sizeof rq);
  rq.transport = HR_HANDOFF_IN_PROCESS;
  p.release = share_release_home;
  p.release_ctx = sh;
  /* On a refusal the ledger calls share_release_home itself. */
  rv = hr_handoff_accept(hub->ledger, &rq, &b, &p, &sh->h, st);
  if (rv)
    return rv;
  return wrap_tree(sh, t, out, st);
}

/* ------------------------------------------------------------------------ */
/* Answers (server loop thread) and completions (client loop thread)        */
/* ------------------------------------------------------------------------ */

static void client_complete(op *o, int gone);

static void respond(req *r, int status, uint32_t wire, const char *msg) {
  hr_inproc_server *s = r->c->s;
  /* Once posted, `r` belongs to the client's thread: whoever needs to know
   * that it was answered asks the server, never `r`. */
  if (s->in_on_get == r)
    s->answered_in_on_get = 1;
  r->answered = 1;
  r->status = status;
  r->wire = wire;
  if (msg)
    snprintf(r->msg, sizeof r->msg, "%s", msg);
  r->o.fn = client_complete;
  box_post(r->c->b, &r->o);
}

static void unlink_get(hr_inproc_server *s, req *r) {
  if (r->prev)
    r->prev->next = r->next;
  else if (s->gets == r)
    s->gets = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

static const hr_get_info *lget_info(const hr_srv_get *g) {
  const req *r = container_of(g, req, g);
  return r->answered ? NULL : &r->info;
}

static int lget_fail(hr_srv_get *g, uint32_t wire, const char *message) {
  req *r = container_of(g, req, g);
  if (r->answered)
    return HR_ERR_STATE;
  unlink_get(r->c->s, r);
  respond(r, HR_ERR_REMOTE, wire, message);
  return 0;
}

#ifdef HR_HAVE_TRANSCODE
/* The stored tensor `t` transcoded into dense `tag` (a copy).  Returns 0,
 * HR_ERR_UNSUPPORTED / HR_ERR_LIMIT (try the next preference),
 * HR_ERR_PROTO (st), HR_ERR_NOMEM. */
static int transcode(hr_inproc_hub *hub, hr_tensor *t, uint8_t tag,
                     unsigned min_align, hr_tensor **out, hr_wire_status *st) {
  const hr_descriptor *sd = hr_tensor_descriptor(t);
  hr_xc_tensor src;
  hr_xc_target tg;
  hr_xc_opts xo;
  hr_xc_plan *p;
  hr_descriptor d;
  uint64_t size;
  int rv;

  memset(&src, 0, sizeof src);
  src.desc = sd;
  for (unsigned k = 0; k < sd->buffer_count; k++) {
    src.buffers[k] = hr_tensor_buffer(t, k);
    src.sizes[k] = sd->buffers[k].size_bytes;
  }
  memset(&tg, 0, sizeof tg);
  tg.layout = tag;
  memset(&xo, 0, sizeof xo);
  xo.max_scratch = 1ull << 30;
  rv = hr_xc_plan_new(&p, &src, &tg, NULL, &xo, &hub->mem, st);
  if (rv == HR_ERR_INVALID_ARGUMENT)
    rv = HR_ERR_UNSUPPORTED;
  if (rv)
    return rv;
  if (hr_xc_plan_needs_whole(p)) {
    hr_xc_plan_del(p);
    return HR_ERR_UNSUPPORTED;
  }
  size = hr_xc_plan_out_size(p);
  d = *sd;
  d.params_raw = NULL;
  d.params_len = 0;
  d.byte_offset = 0;
  hr_xc_plan_describe(p, &d);
  d.buffer_count = 1;
  memset(&d.buffers[0], 0, sizeof d.buffers[0]);
  d.buffers[0].size_bytes = size;
  d.buffers[0].device_tag = HR_DEV_CPU;
  d.buffers[0].memory_class = HR_MEM_STANDARD;
  rv = hr_tensor_alloc(out, &d, min_align, &hub->mem);
  if (rv == 0) {
    rv = hr_xc_run(p, 0, size, hr_tensor_buffer(*out, 0));
    if (rv) {
      hr_tensor_unref(*out);
      *out = NULL;
      rv = rv == HR_ERR_NOMEM ? rv : HR_ERR_UNSUPPORTED;
    }
  }
  hr_xc_plan_del(p);
  return rv;
}
#endif

/* Layout selection: the first preference met as stored, or (with
 * ALLOW_TRANSCODE) produced by the transcoding module; the stored layout
 * when none is.  *use is `t` or a new tensor (a reference either way). */
static int select_layout(hr_inproc_hub *hub, const hr_request *rq, hr_tensor *t,
                         hr_tensor **use, int *transcoded, hr_wire_status *st) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  *transcoded = 0;
  for (uint16_t i = 0; i < rq->layout_count; i++) {
    uint8_t tag = rq->layouts[i].tag;
    if (tag == d->layout.tag && tag < HR_LAYOUT_EXT_FIRST)
      break;
#ifdef HR_HAVE_TRANSCODE
    if ((rq->flags & HR_REQ_ALLOW_TRANSCODE) &&
        (tag == HR_LAYOUT_ROW_MAJOR || tag == HR_LAYOUT_COLUMN_MAJOR) &&
        d->layout.tag != HR_LAYOUT_COMPOSITE &&
        hr_xc_supported(d->element_type, d->layout.tag, tag)) {
      int rv = transcode(hub, t, tag, rq->min_alignment_log2, use, st);
      if (rv == 0) {
        *transcoded = 1;
        return 0;
      }
      if (rv != HR_ERR_UNSUPPORTED && rv != HR_ERR_LIMIT)
        return rv;
    }
#else
    (void)hub;
    (void)st;
#endif
  }
  *use = hr_tensor_ref(t);
  return 0;
}

static int lget_answer(hr_srv_get *g, hr_tensor *t) {
  req *r = container_of(g, req, g);
  hr_inproc_server *s = r->c->s;
  hr_wire_status st;
  hr_tensor *use = NULL;
  int rv;

  if (r->answered)
    return HR_ERR_STATE;
  unlink_get(s, r);
  if (device_of(t) != r->rq.preferred_device) {
    respond(r, HR_ERR_REMOTE, HR_WIRE_DEVICE_UNAVAILABLE,
            "in-process: the tensor is served on the device it is stored "
            "on");
    return 0;
  }
  if (!all_synced(t)) {
    respond(r, HR_ERR_REMOTE, HR_WIRE_INVALID_SYNC_MODE,
            "in-process: a provider's tensor must be PRODUCER_SYNCED");
    return 0;
  }
  memset(&st, 0, sizeof st);
  rv = select_layout(s->hub, &r->rq, t, &use, &r->transcoded, &st);
  if (rv == 0) {
    rv = share_new(s->hub, s->b, use, &r->sh_t, &st);
    hr_tensor_unref(use);
  }
  if (rv == HR_ERR_PROTO) {
    respond(r, HR_ERR_REMOTE, st.code, st.reason);
    return 0;
  }
  if (rv)
    respond(r, HR_ERR_REMOTE, HR_WIRE_INTERNAL, hr_strerror(rv));
  else
    respond(r, 0, 0, NULL);
  return 0;
}

static const hr__local_get_ops lget_ops = {lget_answer, lget_fail, lget_info};

/* ---- server-side handlers ------------------------------------------------ */

static void server_get(req *r) {
  hr_inproc_server *s = r->c->s;
  r->g.st = NULL;
  r->g.local = &lget_ops;
  r->info.key = r->rq.key;
  r->info.key_len = r->rq.key_len;
  r->info.request = &r->rq;
  r->info.stream_id = r->sid;
  r->prev = NULL;
  r->next = s->gets;
  if (s->gets)
    s->gets->prev = r;
  s->gets = r;
  s->in_on_get = r;
  s->answered_in_on_get = 0;
  int rv = s->prov.on_get(s->ds, &r->g, s->prov.user_data);
  s->in_on_get = NULL;
  if (rv != 0 && !s->answered_in_on_get) {
    /* Over a socket the session would die: here only this request. */
    unlink_get(s, r);
    respond(r, HR_ERR_REMOTE, HR_WIRE_INTERNAL,
            "in-process: the provider failed");
  }
}

static void server_put(req *r) {
  hr_inproc_server *s = r->c->s;
  hr_put_info info;
  hr_tensor *landed = NULL;
  hr_wire_status st;
  uint32_t wire = 0;
  int rv;

  memset(&info, 0, sizeof info);
  info.key = r->blob;
  info.key_len = (uint16_t)r->info.key_len;
  info.flags = r->put_flags;
  info.desc = hr_tensor_descriptor(r->put_t);
  info.stream_id = r->sid;
  if (!all_synced(r->put_t)) {
    respond(r, HR_ERR_REMOTE, HR_WIRE_INVALID_SYNC_MODE,
            "in-process: a PUT tensor must be PRODUCER_SYNCED");
    return;
  }
  rv = s->prov.on_put_begin(s->ds, &info, &wire, s->prov.user_data);
  if (rv || wire) {
    respond(r, HR_ERR_REMOTE, wire ? wire : HR_WIRE_INTERNAL,
            "in-process: PUT refused");
    return;
  }
  memset(&st, 0, sizeof st);
  rv = share_new(s->hub, r->c->b, r->put_t, &landed, &st);
  if (rv) {
    if (s->prov.on_put_abort)
      s->prov.on_put_abort(s->ds, &info, s->prov.user_data);
    respond(r, HR_ERR_REMOTE, rv == HR_ERR_PROTO ? st.code : HR_WIRE_INTERNAL,
            rv == HR_ERR_PROTO ? st.reason : hr_strerror(rv));
    return;
  }
  rv = s->prov.on_put_commit(s->ds, &info, landed, &wire, s->prov.user_data);
  hr_tensor_unref(landed);
  if (rv || wire)
    respond(r, HR_ERR_REMOTE, wire ? wire : HR_WIRE_INTERNAL,
            "in-process: PUT commit refused");
  else
    respond(r, 0, 0, NULL);
}

static int list_emit(void *ctx, const hr_list_entry *e) {
  req *r = ctx;
  int n;
  if (r->list_count >= r->lr.max_entries)
    return 1;
  for (;;) {
    n = r->list_raw ? hr_list_entry_put(r->list_raw + r->list_len,
                                        r->list_cap - r->list_len, e)
                    : HR_ERR_BUFFER_TOO_SMALL;
    if (n != HR_ERR_BUFFER_TOO_SMALL)
      break;
    size_t cap = r->list_cap ? r->list_cap * 2 : 4096;
    uint8_t *p = hr__mem_realloc(&r->c->hub->mem, r->list_raw, cap);
    if (!p)
      return HR_ERR_NOMEM;
    r->list_raw = p;
    r->list_cap = cap;
  }
  if (n < 0)
    return n;
  r->list_len += (size_t)n;
  r->list_count++;
  return r->list_count >= r->lr.max_entries;
}

static void server_list(req *r) {
  hr_inproc_server *s = r->c->s;
  int more = 0;
  int rv =
      s->prov.on_list(s->ds, &r->lr, list_emit, r, &more, s->prov.user_data);
  if (rv) {
    respond(r, HR_ERR_REMOTE, HR_WIRE_INTERNAL, "in-process: LIST failed");
    return;
  }
  r->list_more = more != 0;
  respond(r, 0, 0, NULL);
}

static void server_request(op *o, int gone) {
  req *r = container_of(o, req, o);
  hr_inproc_server *s = r->c->s;
  if (gone || s->closed) {
    respond(r, HR_ERR_CLOSED, 0, "in-process: the server closed");
    return;
  }
  switch (r->kind) {
  case K_GET: server_get(r); break;
  case K_PUT: server_put(r); break;
  default: server_list(r); break;
  }
}

/* Cancels every unanswered GET of `c` (`c` NULL: of every connection). */
static void cancel_gets(hr_inproc_server *s, hr_inproc_conn *c) {
  req *r, *next;
  for (r = s->gets; r; r = next) {
    next = r->next;
    if (c && r->c != c)
      continue;
    unlink_get(s, r);
    r->answered = 1;
    if (s->prov.on_get_cancel)
      s->prov.on_get_cancel(s->ds, &r->g, s->prov.user_data);
    respond(r, HR_ERR_CLOSED, HR_WIRE_CANCELLED,
            "in-process: connection closed");
  }
}

typedef struct gone_op {
  op o;
  hr_inproc_conn *c;
} gone_op;

static void server_conn_gone(op *o, int gone) {
  gone_op *g = container_of(o, gone_op, o);
  hr_inproc_conn *c = g->c;
  /* After the engine was freed the server had closed and cancelled
   * everything already. */
  if (!gone)
    cancel_gets(c->s, c);
  hr__mem_free(&c->hub->mem, g);
  conn_unref(c);
}

/* ---- client-side completions --------------------------------------------- */

static void req_free(req *r) {
  hr_inproc_conn *c = r->c;
  hr_mem *mem = &c->hub->mem;
  hr_tensor_unref(r->put_t);
  hr__mem_free(mem, r->blob);
  hr__mem_free(mem, r->list_raw);
  hr__mem_free(mem, r);
  conn_unref(c);
}

static void unlink_req(hr_inproc_conn *c, req *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    c->reqs = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
  c->npending--;
}

static void fill_record(req *r, hr_transfer_record *rec, hr_tensor *t) {
  memset(rec, 0, sizeof *rec);
  rec->kind = r->kind == K_PUT ? HR_XFER_PUT : HR_XFER_GET;
  rec->stream_id = r->sid;
  rec->status = r->status;
  rec->wire_error = r->wire;
  rec->wire_error_sent = 0;
  snprintf(rec->message, sizeof rec->message, "%s", r->msg);
  rec->data_plane = HR_PLANE_FRAMES;
  rec->transcoded = r->transcoded;
  rec->shards = 1;
  rec->lanes = 0;
  rec->started = r->started;
  rec->finished = mono_now();
  if (t) {
    const hr_descriptor *d = hr_tensor_descriptor(t);
    rec->layout = d->layout.tag;
    rec->device = device_of(t);
    rec->bytes = hr_tensor_bytes(t);
    for (size_t i = 0; i < hr_tensor_member_count(t); i++)
      rec->bytes += hr_tensor_bytes(hr_tensor_member(t, i));
  }
}

static void run_callback(req *r, hr_tensor *t) {
  hr_transfer_record rec;
  hr_list_response lr;

  r->done = 1;
  switch (r->kind) {
  case K_GET:
    fill_record(r, &rec, t);
    r->gcb(NULL, r->sid, t, &rec, r->ud);
    break;
  case K_PUT:
    fill_record(r, &rec, r->status == 0 ? r->put_t : NULL);
    r->pcb(NULL, r->sid, &rec, r->ud);
    break;
  default:
    memset(&lr, 0, sizeof lr);
    lr.more = (uint8_t)r->list_more;
    lr.entry_count = r->list_count;
    lr.entries_raw = r->list_raw;
    lr.entries_raw_len = r->list_len;
    r->lcb(NULL, r->status, r->wire, &lr, r->ud);
    break;
  }
}

static void client_complete(op *o, int gone) {
  req *r = container_of(o, req, o);
  hr_inproc_conn *c = r->c;
  hr_tensor *t = r->sh_t;

  r->sh_t = NULL;
  if (gone || r->done || c->closed) {
    /* Nobody will see the answer: its tensor goes back at once. */
    if (!gone && !r->done) {
      unlink_req(c, r);
      r->status = HR_ERR_CLOSED;
      r->wire = 0;
      snprintf(r->msg, sizeof r->msg, "in-process: connection closed");
      run_callback(r, NULL);
    }
    hr_tensor_unref(t);
    req_free(r);
    return;
  }
  unlink_req(c, r);
  run_callback(r, t); /* the callback owns `t` now */
  req_free(r);
}

typedef struct close_op {
  op o;
  hr_inproc_conn *c;
} close_op;

static void client_closed(op *o, int gone) {
  close_op *k = container_of(o, close_op, o);
  hr_inproc_conn *c = k->c;
  req *r;
  while (!gone && (r = c->reqs)) {
    unlink_req(c, r);
    r->status = HR_ERR_CLOSED;
    r->wire = 0;
    snprintf(r->msg, sizeof r->msg, "in-process: connection closed");
    run_callback(r, NULL); /* the answer still comes, and is dropped */
  }
  hr__mem_free(&c->hub->mem, k);
  conn_unref(c);
}

/* ------------------------------------------------------------------------ */
/* Server API                                                                */
/* ------------------------------------------------------------------------ */

int hr_inproc_listen(hr_inproc_hub *hub, hr_engine *e, const char *name,
                     const hr_provider *provider, hr_inproc_server **out) {
  hr_inproc_server *s, *it;
  hr_settings set;
  hr_session_callbacks cbs;
  size_t len;
  int rv;

  if (out)
    *out = NULL;
  if (!hub || !e || !name || !provider || !out ||
      provider->size < offsetof(hr_provider, on_get) + sizeof(void *))
    return HR_ERR_INVALID_ARGUMENT;
  len = strlen(name);
  if (len == 0 || len > 255)
    return HR_ERR_INVALID_ARGUMENT;
  s = hr__mem_calloc(&hub->mem, 1, sizeof *s);
  if (!s)
    return HR_ERR_NOMEM;
  memcpy(&s->prov, provider,
         provider->size < sizeof s->prov ? provider->size : sizeof s->prov);
  s->prov.size = sizeof s->prov;
  if (!s->prov.on_get) {
    hr__mem_free(&hub->mem, s);
    return HR_ERR_INVALID_ARGUMENT;
  }
  memcpy(s->name, name, len + 1);
  s->hub = hub;
  s->refs = 1;
  hr_settings_default(&set);
  memset(&cbs, 0, sizeof cbs);
  cbs.size = sizeof cbs;
  rv = hr_session_new(&s->ds, HR_ROLE_SERVER, &set, &cbs, &s->prov, NULL, 0,
                      &hub->mem);
  if (rv) {
    hr__mem_free(&hub->mem, s);
    return rv;
  }
  pthread_mutex_lock(&hub->mu);
  for (it = hub->servers; it; it = it->next)
    if (strcmp(it->name, name) == 0)
      break;
  if (!it) {
    /* The shared namespace: an engine's "inproc:NAME" listener may hold
     * the name (the table's lock nests inside the hub's). */
    int taken = hr__inproc_names_bind(&hub->names, name, -1);
    if (taken == HR_ERR_BUSY) {
      pthread_mutex_unlock(&hub->mu);
      hr_session_del(s->ds);
      hr__mem_free(&hub->mem, s);
      return HR_ERR_BUSY;
    }
    s->b = taken ? NULL : box_use(e, &hub->mem);
    if (!s->b && taken == 0)
      hr__inproc_names_unbind(&hub->names, name);
    if (s->b) {
      s->next = hub->servers;
      hub->servers = s;
      hub->objects++;
    }
  }
  pthread_mutex_unlock(&hub->mu);
  if (it || !s->b) {
    hr_session_del(s->ds);
    hr__mem_free(&hub->mem, s);
    return it ? HR_ERR_BUSY : HR_ERR_NOMEM;
  }
  *out = s;
  return 0;
}

void hr_inproc_server_close(hr_inproc_server *s) {
  hr_inproc_hub *hub;
  hr_inproc_server **pp;

  if (!s || s->closed)
    return;
  hub = s->hub;
  pthread_mutex_lock(&hub->mu);
  for (pp = &hub->servers; *pp; pp = &(*pp)->next) {
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  }
  hr__inproc_names_unbind(&hub->names, s->name);
  pthread_mutex_unlock(&hub->mu);
  s->closed = 1;
  cancel_gets(s, NULL);
  box_unuse(s->b);
  srv_unref(s);
}

/* ------------------------------------------------------------------------ */
/* Client API                                                                */
/* ------------------------------------------------------------------------ */

int hr_inproc_connect(hr_inproc_hub *hub, hr_engine *e, const char *name,
                      hr_inproc_conn **out) {
  hr_inproc_conn *c;
  hr_inproc_server *s;

  if (out)
    *out = NULL;
  if (!hub || !e || !name || !out)
    return HR_ERR_INVALID_ARGUMENT;
  c = hr__mem_calloc(&hub->mem, 1, sizeof *c);
  if (!c)
    return HR_ERR_NOMEM;
  pthread_mutex_lock(&hub->mu);
  for (s = hub->servers; s; s = s->next)
    if (strcmp(s->name, name) == 0)
      break;
  if (s) {
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_ACQ_REL);
    hub->objects++;
  }
  pthread_mutex_unlock(&hub->mu);
  if (!s) {
    hr__mem_free(&hub->mem, c);
    return HR_ERR_NOT_FOUND;
  }
  c->b = box_use(e, &hub->mem);
  if (!c->b) {
    hr__mem_free(&hub->mem, c);
    hub_forget(hub);
    srv_unref(s);
    return HR_ERR_NOMEM;
  }
  c->hub = hub;
  c->s = s;
  c->refs = 1;
  c->next_sid = 1;
  *out = c;
  return 0;
}

size_t hr_inproc_conn_pending(const hr_inproc_conn *c) {
  return c ? c->npending : 0;
}

void hr_inproc_conn_close(hr_inproc_conn *c) {
  close_op *k;
  gone_op *g;

  if (!c || c->closed)
    return;
  c->closed = 1;
  box_unuse(c->b);
  /* Both are small and their failure would strand callbacks, so they are
   * allocated before anything else changes; without memory the requests
   * complete as their answers come back (client_complete sees closed). */
  k = hr__mem_calloc(&c->hub->mem, 1, sizeof *k);
  g = hr__mem_calloc(&c->hub->mem, 1, sizeof *g);
  if (k) {
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
    k->c = c;
    k->o.fn = client_closed;
    box_post(c->b, &k->o);
  }
  if (g) {
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
    g->c = c;
    g->o.fn = server_conn_gone;
    box_post(c->s->b, &g->o);
  }
  conn_unref(c);
}

static req *req_new(hr_inproc_conn *c, int kind, size_t blob) {
  req *r = hr__mem_calloc(&c->hub->mem, 1, sizeof *r);
  if (!r)
    return NULL;
  if (blob) {
    r->blob = hr__mem_malloc(&c->hub->mem, blob);
    if (!r->blob) {
      hr__mem_free(&c->hub->mem, r);
      return NULL;
    }
  }
  r->kind = kind;
  r->c = c;
  r->transcoded = 0;
  r->started = mono_now();
  return r;
}

static void req_send(hr_inproc_conn *c, req *r, uint32_t *stream_id) {
  r->sid = c->next_sid;
  c->next_sid += 2;
  if (stream_id)
    *stream_id = r->sid;
  r->next = c->reqs;
  if (c->reqs)
    c->reqs->prev = r;
  c->reqs = r;
  c->npending++;
  __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
  r->o.fn = server_request;
  box_post(c->s->b, &r->o);
}

int hr_inproc_get(hr_inproc_conn *c, const hr_get_opts *opts, hr_get_cb cb,
                  void *user_data, uint32_t *stream_id) {
  size_t blob;
  req *r;
  uint8_t *p;

  if (!c || !opts || !cb || !opts->key || opts->key_len == 0 ||
      opts->key_len > 1024 || opts->layout_count > HR_MAX_LAYOUTS ||
      (opts->layout_count && !opts->layouts))
    return HR_ERR_INVALID_ARGUMENT;
  if (c->closed)
    return HR_ERR_STATE;
  if ((opts->flags & HR_REQ_REGION) || opts->dest)
    return HR_ERR_UNSUPPORTED;
  blob = opts->key_len;
  for (uint16_t i = 0; i < opts->layout_count; i++)
    if (opts->layouts[i].ext)
      blob += opts->layouts[i].ext_len;
  r = req_new(c, K_GET, blob);
  if (!r)
    return HR_ERR_NOMEM;
  p = r->blob;
  memcpy(p, opts->key, opts->key_len);
  r->rq.key = p;
  r->rq.key_len = opts->key_len;
  p += opts->key_len;
  r->rq.flags = opts->flags;
  r->rq.layout_count = opts->layout_count;
  for (uint16_t i = 0; i < opts->layout_count; i++) {
    r->rq.layouts[i] = opts->layouts[i];
    if (opts->layouts[i].ext) {
      memcpy(p, opts->layouts[i].ext, opts->layouts[i].ext_len);
      r->rq.layouts[i].ext = p;
      p += opts->layouts[i].ext_len;
    }
  }
  r->rq.preferred_device = opts->preferred_device;
  r->rq.min_alignment_log2 = opts->min_alignment_log2;
  r->rq.max_shards = opts->max_shards;
  r->gcb = cb;
  r->ud = user_data;
  req_send(c, r, stream_id);
  return 0;
}

int hr_inproc_put(hr_inproc_conn *c, const uint8_t *key, uint16_t key_len,
                  uint32_t flags, hr_tensor *t, hr_put_cb cb, void *user_data,
                  uint32_t *stream_id) {
  req *r;
  if (!c || !key || key_len == 0 || key_len > 1024 || !t || !cb)
    return HR_ERR_INVALID_ARGUMENT;
  if (c->closed)
    return HR_ERR_STATE;
  if (!c->s->prov.on_put_begin || !c->s->prov.on_put_commit)
    return HR_ERR_UNSUPPORTED;
  r = req_new(c, K_PUT, key_len);
  if (!r)
    return HR_ERR_NOMEM;
  memcpy(r->blob, key, key_len);
  r->info.key_len = key_len;
  r->put_flags = flags;
  r->put_t = hr_tensor_ref(t);
  r->pcb = cb;
  r->ud = user_data;
  req_send(c, r, stream_id);
  return 0;
}

static const uint8_t empty_key[1];

int hr_inproc_list(hr_inproc_conn *c, const uint8_t *prefix,
                   uint16_t prefix_len, const uint8_t *start_after,
                   uint16_t start_after_len, uint16_t max_entries,
                   hr_list_cb cb, void *user_data) {
  req *r;
  if (!c || !cb || max_entries == 0 || max_entries > 1024 ||
      (prefix_len && !prefix) || (start_after_len && !start_after))
    return HR_ERR_INVALID_ARGUMENT;
  if (c->closed)
    return HR_ERR_STATE;
  if (!c->s->prov.on_list)
    return HR_ERR_UNSUPPORTED;
  r = req_new(c, K_LIST, (size_t)prefix_len + start_after_len);
  if (!r)
    return HR_ERR_NOMEM;
  if (prefix_len)
    memcpy(r->blob, prefix, prefix_len);
  if (start_after_len)
    memcpy(r->blob + prefix_len, start_after, start_after_len);
  /* Never NULL, even when empty: as decoded from a LIST_REQUEST, which
   * points into its payload (providers may memcmp() zero bytes of it). */
  r->lr.prefix = prefix_len ? r->blob : empty_key;
  r->lr.prefix_len = prefix_len;
  r->lr.start_after = start_after_len ? r->blob + prefix_len : empty_key;
  r->lr.start_after_len = start_after_len;
  r->lr.max_entries = max_entries;
  r->lcb = cb;
  r->ud = user_data;
  req_send(c, r, NULL);
  return 0;
}
