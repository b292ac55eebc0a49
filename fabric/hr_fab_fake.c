/*
 * The fake fabric (see hr_fab_fake.h): deterministic and in memory.
 *
 * An operation is queued when it starts and runs at its endpoint's next
 * hr__fake_progress(); its completion then waits in the endpoint's FIFO
 * until a progress call delivers it.  Tagged pieces go to the target's
 * posted receives in posting order, or wait in its unexpected queue (the
 * data stays in the sender's memory until matched, as with a rendezvous
 * protocol); a send completes when its last piece was matched.
 */
#include <string.h>

#include "hr_fab_fake.h"
#include "hr_fab_int.h"

enum { OP_WRITE, OP_SEND, OP_RECV };

typedef struct fake_op fake_op;
typedef struct fake_piece fake_piece;
typedef struct fake_reg fake_reg;

struct fake_reg {
  fake_reg *next;
  uint64_t key;
  uint64_t base; /* what `address` names: a virtual address or 0 */
  int access;
  hr_fabric_region r;
};

struct fake_op {
  fake_op *next; /* run queue, then completion FIFO */
  hr__fake_ep *ep;
  hr_fabric_op *op;
  int kind;
  hr__fake_ep *peer; /* NULL once the peer is gone */
  uint64_t tag;
  hr_fabric_region r;
  hr_fabric_key dst;
  uint64_t npieces;
  uint64_t matched; /* send: pieces matched; recv: pieces filled */
  int cancelled;
  int queued; /* its completion is in the FIFO */
  int status;
  char why[128];
};

struct fake_piece {
  fake_piece *next;
  fake_op *op;
  hr__fake_ep *src; /* unexpected: the sender; posted: the peer expected */
  uint64_t tag;
  void *ptr;
  uint64_t len;
};

struct hr__fake_ep {
  hr__fake_world *w;
  hr__fake_ep *next;
  char name[64];
  int virt_addr;
  int raw_keys;
  fake_reg *regs;
  fake_op *run_head, *run_tail;   /* started, not run */
  fake_op *done_head, *done_tail; /* completions to deliver */
  fake_piece *posted;             /* our receives, posting order */
  fake_piece *unexpected;         /* pieces sent to us, arrival order */
  hr__fake_faults faults;
  hr__fake_stats st;
  hr__fab_track *track; /* memory freed on any thread */
  int hmem;             /* hr__fake_set_hmem(): a device kind is reached */
  uint8_t hmem_tag;
};

/* Host memory always; device memory only of the kind the test granted
 * (a fabric without FI_HMEM refuses the rest, as the real one does). */
static int reaches(const hr__fake_ep *e, const hr_fabric_region *r, char *why,
                   size_t why_cap) {
  if (r->device_tag == HR_DEV_CPU || (e->hmem && r->device_tag == e->hmem_tag))
    return 1;
  hr__fab_why(why, why_cap, "device memory (tag 0x%02x) needs FI_HMEM",
              r->device_tag);
  return 0;
}

void hr__fake_set_hmem(hr__fake_ep *e, uint8_t device_tag) {
  e->hmem = 1;
  e->hmem_tag = device_tag;
}

struct hr__fake_world {
  hr_mem mem;
  hr__fake_ep *eps;
  uint64_t next_key;
};

/* ---- lists ---- */

static void piece_append(fake_piece **head, fake_piece *p) {
  p->next = NULL;
  while (*head)
    head = &(*head)->next;
  *head = p;
}

static void op_append(fake_op **head, fake_op **tail, fake_op *o) {
  o->next = NULL;
  if (*tail)
    (*tail)->next = o;
  else
    *head = o;
  *tail = o;
}

/* Removes (and frees) every piece of `o` from a list. */
static void drop_pieces(hr__fake_world *w, fake_piece **head, fake_op *o) {
  while (*head) {
    fake_piece *p = *head;
    if (p->op == o) {
      *head = p->next;
      hr__mem_free(&w->mem, p);
    } else {
      head = &p->next;
    }
  }
}

static void complete(fake_op *o, int status, const char *why) {
  if (o->queued)
    return;
  o->queued = 1;
  o->status = status;
  hr__fab_why(o->why, sizeof o->why, "%s", why ? why : "");
  op_append(&o->ep->done_head, &o->ep->done_tail, o);
}

/* ---- world and endpoints ---- */

int hr__fake_world_new(hr__fake_world **out, const hr_mem *mem) {
  if (!mem)
    mem = hr_mem_default();
  hr__fake_world *w = hr__mem_calloc(mem, 1, sizeof *w);
  if (!w)
    return HR_ERR_NOMEM;
  w->mem = *mem;
  w->next_key = 0x1000;
  *out = w;
  return 0;
}

void hr__fake_world_del(hr__fake_world *w) {
  if (w)
    hr__mem_free(&w->mem, w);
}

int hr__fake_ep_new(hr__fake_ep **out, hr__fake_world *w, const char *name,
                    int virt_addr, int raw_keys) {
  if (!out || !w || !name || strlen(name) >= sizeof((hr__fake_ep *)0)->name)
    return HR_ERR_INVALID_ARGUMENT;
  for (hr__fake_ep *e = w->eps; e; e = e->next)
    if (strcmp(e->name, name) == 0)
      return HR_ERR_INVALID_ARGUMENT;
  hr__fake_ep *e = hr__mem_calloc(&w->mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  e->w = w;
  memcpy(e->name, name, strlen(name) + 1);
  e->virt_addr = virt_addr;
  e->raw_keys = raw_keys;
  e->faults.peer_gone_after = -1;
  if (hr__fab_track_new(&e->track, &w->mem)) {
    hr__mem_free(&w->mem, e);
    return HR_ERR_NOMEM;
  }
  e->next = w->eps;
  w->eps = e;
  *out = e;
  return 0;
}

static void free_ops(hr__fake_world *w, fake_op *o) {
  while (o) {
    fake_op *n = o->next;
    hr__mem_free(&w->mem, o);
    o = n;
  }
}

static void free_pieces(hr__fake_world *w, fake_piece *p) {
  while (p) {
    fake_piece *n = p->next;
    hr__mem_free(&w->mem, p);
    p = n;
  }
}

void hr__fake_ep_del(hr__fake_ep *e) {
  if (!e)
    return;
  hr__fake_world *w = e->w;
  for (hr__fake_ep **pp = &w->eps; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      break;
    }
  /* The others lose this peer: their operations towards it fail when they
   * run, and pieces it sent them vanish. */
  for (hr__fake_ep *o = w->eps; o; o = o->next) {
    for (fake_op *op = o->run_head; op; op = op->next)
      if (op->peer == e)
        op->peer = NULL;
    fake_piece **pp = &o->unexpected;
    while (*pp) {
      fake_piece *p = *pp;
      if (p->src == e) {
        *pp = p->next;
        hr__mem_free(&w->mem, p);
      } else {
        pp = &p->next;
      }
    }
  }
  while (e->regs) {
    fake_reg *r = e->regs;
    e->regs = r->next;
    hr__mem_free(&w->mem, r);
  }
  /* Sends of others that wait here for a receive end: the peer is gone. */
  for (fake_piece *p = e->unexpected; p; p = p->next)
    if (p->op->ep != e)
      complete(p->op, HR_ERR_CLOSED, "peer gone");
  free_pieces(w, e->posted);
  free_pieces(w, e->unexpected);
  free_ops(w, e->run_head);
  free_ops(w, e->done_head);
  hr__fab_track_unref(e->track);
  hr__mem_free(&w->mem, e);
}

hr__fake_faults *hr__fake_faults_of(hr__fake_ep *e) {
  return &e->faults;
}

void hr__fake_get_stats(const hr__fake_ep *e, hr__fake_stats *st) {
  *st = e->st;
}

int64_t hr__fake_address(const hr__fake_ep *e, uint8_t *out, size_t cap) {
  return hr_fabric_address_encode("fake", e->name, strlen(e->name), out, cap);
}

static int fault(int *counter) {
  if (*counter <= 0)
    return 0;
  (*counter)--;
  return 1;
}

/* ---- ops: peers and registrations ---- */

static int fake_peer_add(void *ctx, const uint8_t *prov, uint16_t prov_len,
                         const uint8_t *name, uint16_t name_len,
                         const void *ctl_addr, size_t ctl_addr_len, void **peer,
                         char *why, size_t why_cap) {
  hr__fake_ep *e = ctx;
  (void)ctl_addr;
  (void)ctl_addr_len;
  if (fault(&e->faults.peer_add)) {
    hr__fab_why(why, why_cap, "injected: address refused");
    return HR_ERR_UNSUPPORTED;
  }
  if (prov_len != 4 || memcmp(prov, "fake", 4) != 0) {
    hr__fab_why(why, why_cap, "provider differs from ours (fake)");
    return HR_ERR_UNSUPPORTED;
  }
  for (hr__fake_ep *o = e->w->eps; o; o = o->next)
    if (strlen(o->name) == name_len && memcmp(o->name, name, name_len) == 0) {
      *peer = o;
      e->st.peers++;
      return 0;
    }
  hr__fab_why(why, why_cap, "no endpoint of that name");
  return HR_ERR_UNSUPPORTED;
}

static void fake_peer_del(void *ctx, void *peer) {
  hr__fake_ep *e = ctx;
  (void)peer;
  e->st.peers--;
}

static int fake_reg_fn(void *ctx, const hr_fabric_region *r, int access,
                       hr_fabric_key *key, void **mr, char *why,
                       size_t why_cap) {
  hr__fake_ep *e = ctx;
  int *f = access == HR_FABRIC_REMOTE_READ ? &e->faults.reg_source
                                           : &e->faults.reg_dest;
  if (fault(f)) {
    hr__fab_why(why, why_cap, "injected: registration refused");
    return HR_ERR_UNSUPPORTED;
  }
  if (!reaches(e, r, why, why_cap))
    return HR_ERR_UNSUPPORTED;
  e->st.last_reg_device_tag = r->device_tag;
  fake_reg *g = hr__mem_calloc(&e->w->mem, 1, sizeof *g);
  if (!g) {
    hr__fab_why(why, why_cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  g->key = e->w->next_key++;
  g->access = access;
  g->r = *r;
  g->base = 0;
  if (e->virt_addr)
    for (unsigned k = 0; k < r->nseg; k++)
      if (r->seg[k].len) {
        g->base = (uint64_t)(uintptr_t)r->seg[k].ptr;
        break;
      }
  g->next = e->regs;
  e->regs = g;
  memset(key, 0, sizeof *key);
  key->length = r->length;
  key->address = g->base;
  if (e->raw_keys) {
    /* "RAWK" and the key, little-endian: 12 opaque bytes. */
    memcpy(key->raw_key, "RAWK", 4);
    for (int i = 0; i < 8; i++)
      key->raw_key[4 + i] = (uint8_t)(g->key >> (8 * i));
    key->raw_key_len = 12;
  } else {
    key->key = g->key;
  }
  *mr = g;
  e->st.regs++;
  e->st.live_regs++;
  return 0;
}

static void fake_dereg(void *ctx, void *mr) {
  hr__fake_ep *e = ctx;
  for (fake_reg **pp = &e->regs; *pp; pp = &(*pp)->next)
    if (*pp == mr) {
      *pp = ((fake_reg *)mr)->next;
      hr__mem_free(&e->w->mem, mr);
      e->st.deregs++;
      e->st.live_regs--;
      return;
    }
}

/* The key a raw key stands for; 0 when it is not ours. */
static int map_key(const hr__fake_ep *target, const hr_fabric_key *k,
                   uint64_t *out) {
  if (k->raw_key_len == 0) {
    if (target->raw_keys)
      return 0;
    *out = k->key;
    return 1;
  }
  if (!target->raw_keys || k->raw_key_len != 12 ||
      memcmp(k->raw_key, "RAWK", 4) != 0)
    return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)k->raw_key[4 + i] << (8 * i);
  *out = v;
  return 1;
}

/* Copies `len` bytes into the region at region offset `off`. */
static void copy_into(const hr_fabric_region *r, uint64_t off,
                      const uint8_t *src, uint64_t len) {
  for (unsigned k = 0; k < r->nseg && len; k++) {
    uint64_t sl = r->seg[k].len;
    if (off >= sl) {
      off -= sl;
      continue;
    }
    uint64_t n = sl - off < len ? sl - off : len;
    memcpy((uint8_t *)r->seg[k].ptr + off, src, n);
    src += n;
    len -= n;
    off = 0;
  }
}

/* Finds the live WRITE registration `key` names in `target` and checks
 * [address, address + len) against it; returns the region offset or -1. */
static int64_t resolve(const hr__fake_ep *target, const hr_fabric_key *key,
                       uint64_t address, uint64_t len, const fake_reg **out) {
  uint64_t k;
  if (!map_key(target, key, &k))
    return -1;
  for (const fake_reg *g = target->regs; g; g = g->next) {
    if (g->key != k || g->access != HR_FABRIC_REMOTE_WRITE)
      continue;
    if (address < g->base || address - g->base > g->r.length ||
        len > g->r.length - (address - g->base))
      return -1;
    *out = g;
    return (int64_t)(address - g->base);
  }
  return -1;
}

int hr__fake_poke(hr__fake_ep *target, const hr_fabric_key *key,
                  uint64_t address, const void *src, uint64_t len) {
  const fake_reg *g;
  int64_t off = resolve(target, key, address, len, &g);
  if (off < 0)
    return HR_ERR_IO;
  copy_into(&g->r, (uint64_t)off, src, len);
  return 0;
}

/* ---- ops: data ---- */

static fake_op *new_op(hr__fake_ep *e, int kind, void *peer, uint64_t tag,
                       const hr_fabric_region *r, hr_fabric_op *op) {
  fake_op *o = hr__mem_calloc(&e->w->mem, 1, sizeof *o);
  if (!o)
    return NULL;
  o->ep = e;
  o->op = op;
  o->kind = kind;
  o->peer = peer;
  o->tag = tag;
  o->r = *r;
  op->backend = o;
  return o;
}

static int fake_write(void *ctx, void *peer, const hr_fabric_region *src,
                      const hr_fabric_key *dst, hr_fabric_op *op, char *why,
                      size_t why_cap) {
  hr__fake_ep *e = ctx;
  uint64_t k;
  if (fault(&e->faults.write_start)) {
    hr__fab_why(why, why_cap, "injected: write refused");
    return HR_ERR_UNSUPPORTED;
  }
  if (!map_key(peer, dst, &k)) {
    hr__fab_why(why, why_cap, "the destination key does not map");
    return HR_ERR_UNSUPPORTED;
  }
  fake_op *o = new_op(e, OP_WRITE, peer, 0, src, op);
  if (!o) {
    hr__fab_why(why, why_cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  o->dst = *dst;
  op_append(&e->run_head, &e->run_tail, o);
  e->st.writes++;
  return 0;
}

static int fake_send(void *ctx, void *peer, uint64_t tag,
                     const hr_fabric_region *src, hr_fabric_op *op, char *why,
                     size_t why_cap) {
  hr__fake_ep *e = ctx;
  if (fault(&e->faults.send_start)) {
    hr__fab_why(why, why_cap, "injected: send refused");
    return HR_ERR_UNSUPPORTED;
  }
  fake_op *o = new_op(e, OP_SEND, peer, tag, src, op);
  if (!o) {
    hr__fab_why(why, why_cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  op_append(&e->run_head, &e->run_tail, o);
  e->st.sends++;
  return 0;
}

/* Fills posted piece `pp` of receive `ro` from unexpected or sent piece
 * (`ptr`, `len`), completing the receive when it is full. */
static void fill(fake_op *ro, fake_piece *pp, const void *ptr, uint64_t len) {
  uint64_t n = len < pp->len ? len : pp->len;
  if (n)
    memcpy(pp->ptr, ptr, n);
  if (len != pp->len && ro->status == 0) {
    ro->status = HR_ERR_PROTO;
    hr__fab_why(ro->why, sizeof ro->why,
                "a tagged message of %llu bytes met a receive of %llu",
                (unsigned long long)len, (unsigned long long)pp->len);
  }
  if (++ro->matched == ro->npieces) {
    char why[128];
    memcpy(why, ro->why, sizeof why);
    complete(ro, ro->status, why);
  }
}

/* A sent piece met a receive: count it on the send. */
static void piece_matched(fake_op *so) {
  if (++so->matched == so->npieces)
    complete(so, 0, NULL);
}

/* Delivers one sent piece to the target: the first posted receive piece
 * for (sender, tag), else the unexpected queue. */
static int deliver(hr__fake_ep *target, fake_op *so, void *ptr, uint64_t len) {
  hr__fake_world *w = target->w;
  for (fake_piece **pp = &target->posted; *pp; pp = &(*pp)->next) {
    fake_piece *p = *pp;
    if (p->tag != so->tag || (p->src && p->src != so->ep))
      continue;
    *pp = p->next;
    fill(p->op, p, ptr, len);
    hr__mem_free(&w->mem, p);
    piece_matched(so);
    return 0;
  }
  fake_piece *u = hr__mem_calloc(&w->mem, 1, sizeof *u);
  if (!u)
    return HR_ERR_NOMEM;
  u->op = so;
  u->src = so->ep;
  u->tag = so->tag;
  u->ptr = ptr;
  u->len = len;
  piece_append(&target->unexpected, u);
  target->st.unexpected++;
  return 0;
}

static int fake_recv(void *ctx, void *peer, uint64_t tag,
                     const hr_fabric_region *dst, hr_fabric_op *op, char *why,
                     size_t why_cap) {
  hr__fake_ep *e = ctx;
  hr__fake_world *w = e->w;
  if (fault(&e->faults.recv_start)) {
    hr__fab_why(why, why_cap, "injected: receives refused");
    return HR_ERR_UNSUPPORTED;
  }
  if (!reaches(e, dst, why, why_cap))
    return HR_ERR_UNSUPPORTED;
  for (fake_piece *p = e->posted; p; p = p->next)
    if (p->tag == tag && p->src == peer) {
      hr__fab_why(why, why_cap, "receives with tag %llu are posted already",
                  (unsigned long long)tag);
      return HR_ERR_BUSY;
    }
  fake_op *o = new_op(e, OP_RECV, peer, tag, dst, op);
  if (!o) {
    hr__fab_why(why, why_cap, "out of memory");
    return HR_ERR_NOMEM;
  }
  uint64_t piece = hr_fabric_tag_piece(NULL, dst->length);
  o->npieces = hr__fab_count_pieces(dst, piece);
  hr__fab_cursor c = {0, 0, 0};
  void *ptr;
  uint64_t len, off;
  fake_piece *mine = NULL;
  while (hr__fab_next_piece(dst, &c, piece, &ptr, &len, &off)) {
    fake_piece *p = hr__mem_calloc(&w->mem, 1, sizeof *p);
    if (!p) {
      free_pieces(w, mine);
      hr__mem_free(&w->mem, o);
      hr__fab_why(why, why_cap, "out of memory");
      return HR_ERR_NOMEM;
    }
    p->op = o;
    p->src = peer;
    p->tag = tag;
    p->ptr = ptr;
    p->len = len;
    piece_append(&mine, p);
  }
  if (fault(&e->faults.recv_error)) {
    free_pieces(w, mine);
    complete(o, HR_ERR_IO, "injected: receive completion error");
    e->st.recvs++;
    return 0;
  }
  /* Post in order; each posted piece first takes the oldest unexpected
   * piece of (peer, tag). */
  while (mine) {
    fake_piece *p = mine;
    mine = p->next;
    fake_piece **up = &e->unexpected;
    while (*up && !((*up)->tag == tag && (*up)->src == peer))
      up = &(*up)->next;
    if (*up) {
      fake_piece *u = *up;
      *up = u->next;
      fill(o, p, u->ptr, u->len);
      piece_matched(u->op);
      hr__mem_free(&w->mem, u);
      hr__mem_free(&w->mem, p);
    } else {
      piece_append(&e->posted, p);
    }
  }
  if (o->npieces == 0)
    complete(o, 0, NULL);
  e->st.recvs++;
  return 0;
}

static void fake_cancel(void *ctx, hr_fabric_op *op) {
  hr__fake_ep *e = ctx;
  fake_op *o = op->backend;
  e->st.cancels++;
  if (!o || o->queued)
    return;
  o->cancelled = 1;
  if (o->kind == OP_RECV) {
    drop_pieces(e->w, &e->posted, o);
    complete(o, HR_ERR_CLOSED, "cancelled");
    return;
  }
  /* A send already run: withdraw what still waits at the target. */
  for (fake_op *r = e->run_head; r; r = r->next)
    if (r == o)
      return; /* not run yet: it completes as cancelled when it runs */
  if (o->kind == OP_SEND && o->peer)
    drop_pieces(e->w, &o->peer->unexpected, o);
  complete(o, HR_ERR_CLOSED, "cancelled");
}

/* Runs one started write or send. */
static void run(hr__fake_ep *e, fake_op *o) {
  hr__fake_faults *f = &e->faults;
  if (o->cancelled) {
    complete(o, HR_ERR_CLOSED, "cancelled");
    return;
  }
  if (!o->peer) {
    complete(o, HR_ERR_CLOSED, "peer gone");
    return;
  }
  int64_t budget = f->peer_gone_after;
  if (o->kind == OP_WRITE) {
    const fake_reg *g;
    if (fault(&f->write_error)) {
      complete(o, HR_ERR_IO, "injected: write completion error");
      return;
    }
    int64_t off = resolve(o->peer, &o->dst, o->dst.address, o->r.length, &g);
    if (off < 0) {
      complete(o, HR_ERR_IO, "remote access error: the key opens nothing");
      return;
    }
    hr__fab_cursor c = {0, 0, 0};
    void *ptr;
    uint64_t len, roff;
    while (hr__fab_next_piece(&o->r, &c, UINT64_MAX, &ptr, &len, &roff)) {
      if (budget >= 0 && (uint64_t)budget < len) {
        copy_into(&g->r, (uint64_t)off + roff, ptr, (uint64_t)budget);
        e->st.bytes += (uint64_t)budget;
        complete(o, HR_ERR_CLOSED, "peer gone during the write");
        return;
      }
      copy_into(&g->r, (uint64_t)off + roff, ptr, len);
      e->st.bytes += len;
      if (budget >= 0)
        budget -= (int64_t)len;
    }
    complete(o, 0, NULL);
    return;
  }
  /* OP_SEND */
  if (fault(&f->send_error)) {
    complete(o, HR_ERR_IO, "injected: send completion error");
    return;
  }
  uint64_t piece =
      f->send_piece ? f->send_piece : hr_fabric_tag_piece(NULL, o->r.length);
  o->npieces = hr__fab_count_pieces(&o->r, piece);
  if (o->npieces == 0) {
    complete(o, 0, NULL);
    return;
  }
  hr__fab_cursor c = {0, 0, 0};
  void *ptr;
  uint64_t len, roff;
  while (hr__fab_next_piece(&o->r, &c, piece, &ptr, &len, &roff)) {
    if (budget >= 0 && (uint64_t)budget < len) {
      drop_pieces(e->w, &o->peer->unexpected, o);
      complete(o, HR_ERR_CLOSED, "peer gone during the sends");
      return;
    }
    if (deliver(o->peer, o, ptr, len) != 0) {
      drop_pieces(e->w, &o->peer->unexpected, o);
      complete(o, HR_ERR_NOMEM, "out of memory");
      return;
    }
    e->st.bytes += len;
    if (budget >= 0)
      budget -= (int64_t)len;
  }
}

static void run_started(hr__fake_ep *e) {
  while (e->run_head) {
    fake_op *o = e->run_head;
    e->run_head = o->next;
    if (!e->run_head)
      e->run_tail = NULL;
    o->next = NULL;
    run(e, o);
  }
}

static int deliver_one(hr__fake_ep *e) {
  fake_op *o = e->done_head;
  if (!o)
    return 0;
  e->done_head = o->next;
  if (!e->done_head)
    e->done_tail = NULL;
  hr_fabric_op *op = o->op;
  int status = o->status;
  char why[128];
  memcpy(why, o->why, sizeof why);
  op->backend = NULL;
  hr__mem_free(&e->w->mem, o);
  op->done(op, status, status ? why : NULL);
  return 1;
}

int hr__fake_progress_one(hr__fake_ep *e) {
  run_started(e);
  return deliver_one(e);
}

static void invalidated(void *ctx, const void *ptr, uint64_t len) {
  hr__fake_ep *e = ctx;
  e->st.invalidations++;
  e->st.last_invalidated = ptr;
  e->st.last_invalidated_len = len;
}

int hr__fake_progress(hr__fake_ep *e) {
  int n = 0;
  hr__fab_track_drain(e->track, invalidated, e);
  for (;;) {
    run_started(e);
    if (!deliver_one(e))
      break;
    n++;
  }
  return n;
}

size_t hr__fake_pending(const hr__fake_ep *e) {
  size_t n = 0;
  for (const fake_op *o = e->run_head; o; o = o->next)
    n++;
  for (const fake_op *o = e->done_head; o; o = o->next)
    n++;
  return n;
}

static void *fake_tracker(void *ctx) {
  return hr__fab_track_ref(((hr__fake_ep *)ctx)->track);
}

static void fake_tracker_invalidate(void *trk, const void *ptr, uint64_t len) {
  hr__fab_track_push(trk, ptr, len);
}

static void fake_tracker_unref(void *trk) {
  hr__fab_track_unref(trk);
}

static const hr_fabric_ops fake_ops = {sizeof(hr_fabric_ops),
                                       fake_peer_add,
                                       fake_peer_del,
                                       fake_reg_fn,
                                       fake_dereg,
                                       fake_write,
                                       fake_send,
                                       fake_recv,
                                       fake_cancel,
                                       fake_tracker,
                                       fake_tracker_invalidate,
                                       fake_tracker_unref};

const hr_fabric_ops *hr__fake_ops(void) {
  return &fake_ops;
}
