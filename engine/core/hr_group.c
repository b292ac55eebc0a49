/*
 * Lanes: one session over several connections (docs/protocol.md § 14.5).
 *
 * Every connection keeps its own hr_session (reader, output queue, stream
 * table, timers); an hr_group links the sessions of one protocol session
 * and holds what belongs to the session as a whole: the stream id space,
 * the lanes in join order, the SESSION_TOKEN, and the call and callback
 * brackets.  A stream lives in the table of the session that produces or
 * owns it:
 *
 *  - server: a request and its shard 0 on lane 0 (requests arrive there),
 *    shard i on lane (i mod L), where it is scheduled and sent;
 *  - client: a GET on lane 0, where it was sent; its shards arrive on any
 *    lane and are checked and placed by the GET's hr_rx and destination,
 *    whichever lane carried them.
 *
 * Lookups by stream id search every lane, so a message for a stream may
 * arrive on another lane than the one that owns it (a CANCEL for shard 3
 * on lane 0, shard 3's frames on lane 1 of a client).
 *
 * The server's registry maps tokens to groups; a token is registered
 * while its lane 0 is open.  Randomness comes from the host through the
 * registry's hr_random_fn.
 */
#include <string.h>

#include "hr_session_int.h"

/* ---- helpers ------------------------------------------------------------- */

static int lane_open(const hr_session *s) {
  return s && !s->deleted && !s->fatal && s->state != HR_CS_CLOSED;
}

static int token_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
  size_t n = an < bn ? an : bn;
  int c = memcmp(a, b, n);
  if (c)
    return c;
  return an < bn ? -1 : an > bn;
}

/* Adds `s`, possibly inside a call or a callback, to `g`: the brackets it
 * is in now become the group's, so that leaving them balances. */
static void attach(hr_group *g, hr_session *s, int lane) {
  s->grp = g;
  s->lane = lane;
  s->ids = &g->ids;
  g->refs++;
  g->depth += s->depth;
  g->in_cb += s->in_cb;
}

static hr_group *group_alloc(const hr_mem *mem, int role) {
  hr_group *g = hr__mem_calloc(mem, 1, sizeof *g);
  if (!g)
    return NULL;
  g->mem = *mem;
  g->role = role;
  return g;
}

/* ---- the registry (server) ----------------------------------------------- */

void hr__registry_unref(hr_registry *r) {
  if (!r || --r->refs > 0)
    return;
  for (size_t i = 0; i < r->n; i++)
    r->groups[i]->reg = NULL;
  hr_mem mem = r->mem;
  hr__mem_free(&mem, r->groups);
  hr__mem_free(&mem, r);
}

static size_t reg_lower(const hr_registry *r, const uint8_t *tok, size_t n) {
  size_t lo = 0, hi = r->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const hr_group *g = r->groups[mid];
    if (token_cmp(g->token, g->token_len, tok, n) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static hr_group *reg_find(const hr_registry *r, const uint8_t *tok, size_t n) {
  if (!r || !r->random)
    return NULL;
  size_t i = reg_lower(r, tok, n);
  if (i < r->n &&
      !token_cmp(r->groups[i]->token, r->groups[i]->token_len, tok, n))
    return r->groups[i];
  return NULL;
}

/* 0, 1 when the token is taken, or HR_ERR_NOMEM. */
static int reg_insert(hr_registry *r, hr_group *g) {
  size_t i = reg_lower(r, g->token, g->token_len);
  if (i < r->n && !token_cmp(r->groups[i]->token, r->groups[i]->token_len,
                             g->token, g->token_len))
    return 1;
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 16;
    hr_group **ng = hr__mem_realloc(&r->mem, r->groups, cap * sizeof *ng);
    if (!ng)
      return HR_ERR_NOMEM;
    r->groups = ng;
    r->cap = cap;
  }
  memmove(&r->groups[i + 1], &r->groups[i], (r->n - i) * sizeof *r->groups);
  r->groups[i] = g;
  r->n++;
  g->reg = r;
  return 0;
}

static void reg_remove(hr_group *g) {
  hr_registry *r = g->reg;
  if (!r)
    return;
  size_t i = reg_lower(r, g->token, g->token_len);
  if (i < r->n && r->groups[i] == g) {
    memmove(&r->groups[i], &r->groups[i + 1],
            (r->n - i - 1) * sizeof *r->groups);
    r->n--;
  }
  g->reg = NULL;
}

int hr_registry_new(hr_registry **out, hr_random_fn random,
                    void *random_user_data, const hr_mem *mem) {
  if (!out || !random)
    return HR_ERR_INVALID_ARGUMENT;
  const hr_mem *m = mem ? mem : hr_mem_default();
  hr_registry *r = hr__mem_calloc(m, 1, sizeof *r);
  if (!r)
    return HR_ERR_NOMEM;
  r->refs = 1;
  r->mem = *m;
  r->random = random;
  r->random_ud = random_user_data;
  *out = r;
  return 0;
}

void hr_registry_del(hr_registry *r) {
  if (!r)
    return;
  /* Nothing can be joined any more: forget every token now. */
  while (r->n)
    reg_remove(r->groups[r->n - 1]);
  r->random = NULL;
  hr__registry_unref(r);
}

size_t hr_registry_count(const hr_registry *r) { return r ? r->n : 0; }

int hr_session_set_registry(hr_session *s, hr_registry *r) {
  if (!s || !r || s->role != HR_ROLE_SERVER || !r->random)
    return HR_ERR_INVALID_ARGUMENT;
  if (s->reg || s->state != HR_CS_AWAIT_HELLO || s->have_peer)
    return HR_ERR_STATE;
  s->reg = r;
  r->refs++;
  return 0;
}

/* ---- groups -------------------------------------------------------------- */

void hr__group_unref(hr_group *g) {
  if (!g || --g->refs > 0)
    return;
  reg_remove(g);
  hr_mem mem = g->mem;
  hr__mem_free(&mem, g);
}

/* Server: a new session; its token is registered so that connections can
 * join.  Without randomness the session stays one connection. */
static int server_group_new(hr_session *s) {
  hr_registry *r = s->reg;
  hr_group *g = group_alloc(&s->mem, HR_ROLE_SERVER);
  if (!g)
    return HR_ERR_NOMEM;
  g->token_len = HR_TOKEN_LEN;
  /* A collision of 128 random bits means a broken source: give up. */
  for (int tries = 0;; tries++) {
    if (tries == 4 || r->random(g->token, g->token_len, r->random_ud)) {
      hr_mem mem = g->mem;
      hr__mem_free(&mem, g);
      return 0;
    }
    int rv = reg_insert(r, g);
    if (rv < 0) {
      hr_mem mem = g->mem;
      hr__mem_free(&mem, g);
      return rv;
    }
    if (rv == 0)
      break;
  }
  g->ids = s->own_ids;
  g->lanes[0] = s;
  g->nlanes = 1;
  g->last_activity = s->now;
  attach(g, s, 0);
  return 0;
}

int hr__group_on_client_hello(hr_session *s, uint32_t *wire, const char **why) {
  const hr_hello_exts *x = &s->peer.exts;
  if (!x->session_join)
    return s->reg && s->reg->random ? server_group_new(s) : 0;
  hr_group *g = reg_find(s->reg, x->session_join, x->session_join_len);
  if (!g || !lane_open(g->lanes[0])) {
    *wire = HR_WIRE_UNAUTHORIZED;
    *why = "SESSION_JOIN: unknown session token";
    return 1;
  }
  if (g->nlanes >= HR_MAX_LANES) {
    *wire = HR_WIRE_RESOURCE_EXHAUSTED;
    *why = "SESSION_JOIN: the session has the most lanes allowed";
    return 1;
  }
  unsigned pos = g->nlanes++;
  g->lanes[pos] = s;
  attach(g, s, (int)pos);
  return 0;
}

int hr__group_on_server_hello(hr_session *s, const char **why) {
  hr_group *g = s->grp;
  if (!g || s->lane != HR_LANE_NONE)
    return 0;
  /* A joined lane: its SERVER_HELLO names the same session if it names
   * one at all. */
  const hr_hello_exts *x = &s->peer.exts;
  if (x->session_token && token_cmp(x->session_token, x->session_token_len,
                                    g->token, g->token_len)) {
    *why = "SESSION_JOIN answered with another session's token";
    return 1;
  }
  if (g->joining == s)
    g->joining = NULL;
  unsigned pos = g->nlanes++;
  g->lanes[pos] = s;
  s->lane = (int)pos;
  return 0;
}

int hr_group_new(hr_group **out, hr_session *lane0) {
  if (!out || !lane0 || lane0->role != HR_ROLE_CLIENT || lane0->grp)
    return HR_ERR_INVALID_ARGUMENT;
  if (!lane_open(lane0))
    return HR_ERR_STATE;
  hr_group *g = group_alloc(&lane0->mem, HR_ROLE_CLIENT);
  if (!g)
    return HR_ERR_NOMEM;
  g->refs = 1;
  g->has_handle = 1;
  g->ids = lane0->own_ids;
  g->lanes[0] = lane0;
  g->nlanes = 1;
  g->last_activity = lane0->last_activity;
  attach(g, lane0, 0);
  *out = g;
  return 0;
}

int hr_group_add_lane(hr_group *g, void *user_data, hr_tstamp now,
                      hr_session **out) {
  if (!g || !out || g->role != HR_ROLE_CLIENT)
    return HR_ERR_INVALID_ARGUMENT;
  hr_session *s0 = g->lanes[0];
  if (!lane_open(s0) || s0->state != HR_CS_ESTABLISHED || !s0->have_peer)
    return HR_ERR_STATE;
  const hr_hello_exts *x = &s0->peer.exts;
  if (!x->session_token || x->session_token_len > HR_TOKEN_MAX)
    return HR_ERR_UNSUPPORTED;
  if (g->joining)
    return HR_ERR_BUSY;
  if (g->nlanes >= HR_MAX_LANES)
    return HR_ERR_LIMIT;
  memcpy(g->token, x->session_token, x->session_token_len);
  g->token_len = x->session_token_len;
  hr_session *s = NULL;
  int rv = hr__session_create(&s, HR_ROLE_CLIENT, &s0->set, &s0->cbs, NULL,
                              user_data, now, &s0->mem, g);
  if (rv)
    return rv;
  g->joining = s;
  *out = s;
  return 0;
}

void hr_group_del(hr_group *g) {
  if (!g || !g->has_handle)
    return;
  g->has_handle = 0;
  hr__group_unref(g);
}

unsigned hr_group_lanes(const hr_group *g) { return g ? g->nlanes : 0; }

unsigned hr_group_open_lanes(const hr_group *g) {
  unsigned n = 0;
  for (unsigned i = 0; g && i < g->nlanes; i++)
    n += lane_open(g->lanes[i]) ? 1u : 0u;
  return n;
}

hr_session *hr_group_lane(const hr_group *g, unsigned i) {
  if (!g || i >= g->nlanes || !g->lanes[i] || g->lanes[i]->deleted)
    return NULL;
  return g->lanes[i];
}

hr_group *hr_session_group(const hr_session *s) { return s ? s->grp : NULL; }

int hr_session_lane(const hr_session *s) {
  if (!s)
    return HR_LANE_NONE;
  return s->grp ? s->lane : 0;
}

/* ---- lanes coming and going ---------------------------------------------- */

unsigned hr__lanes_now(const hr_session *s) {
  return s->grp ? s->grp->nlanes : 1;
}

hr_session *hr__lane_at(const hr_session *s, unsigned i) {
  if (!s->grp)
    return i == 0 && lane_open(s) ? (hr_session *)s : NULL;
  if (i >= s->grp->nlanes || !lane_open(s->grp->lanes[i]))
    return NULL;
  return s->grp->lanes[i];
}

hr_session *hr__request_lane(hr_session *s) {
  if (!s->grp)
    return s;
  hr_session *s0 = s->grp->lanes[0];
  return s0 && !s0->deleted ? s0 : NULL;
}

size_t hr__session_streams(const hr_session *s) {
  if (!s->grp)
    return s->ntab;
  size_t n = 0;
  const hr_group *g = s->grp;
  for (unsigned i = 0; i < g->nlanes; i++)
    if (g->lanes[i])
      n += g->lanes[i]->ntab;
  if (g->joining)
    n += g->joining->ntab;
  return n;
}

void hr__group_lane_down(hr_session *s) {
  hr_group *g = s->grp;
  if (!g || s->lane_down)
    return;
  s->lane_down = 1;
  if (g->role == HR_ROLE_SERVER) {
    /* Without lane 0 nothing can be requested: nobody may join any
     * more.  A joined lane's shard streams were failed with it. */
    if (s->lane == 0)
      reg_remove(g);
    return;
  }
  if (g->joining == s) {
    g->joining = NULL;
    /* A HELLO that left may have been taken: unless the server said no,
     * it may count this connection as a lane.  It keeps the position,
     * closed, so that both numberings agree (and later requests stay
     * below it). */
    if (s->consumed == 0 || s->refused)
      return;
    s->lane = (int)g->nlanes;
    g->lanes[g->nlanes++] = s;
  }
  if (s->lane > 0) {
    hr_session *s0 = g->lanes[0];
    if (lane_open(s0))
      hr__cli_lane_lost(s0, (unsigned)s->lane);
  }
}

void hr__group_leave(hr_session *s) {
  hr_group *g = s->grp;
  if (!g)
    return;
  if (s->lane >= 0 && (unsigned)s->lane < g->nlanes && g->lanes[s->lane] == s)
    g->lanes[s->lane] = NULL;
  if (g->joining == s)
    g->joining = NULL;
  if (g->role == HR_ROLE_SERVER && s->lane == 0)
    reg_remove(g);
  s->grp = NULL;
  s->ids = &s->own_ids;
  hr__group_unref(g);
}

/* ---- tensor-parallel slices ---------------------------------------------- */

int hr_region_slice(unsigned rank, const uint64_t *shape, unsigned dim,
                    uint32_t index, uint32_t count, uint64_t *offset,
                    uint64_t *extent) {
  if (!shape || !offset || !extent || rank == 0 || rank > HR_MAX_RANK ||
      dim >= rank || count == 0 || index >= count)
    return HR_ERR_INVALID_ARGUMENT;
  for (unsigned k = 0; k < rank; k++) {
    offset[k] = 0;
    extent[k] = shape[k];
  }
  uint64_t n = shape[dim], q = n / count, r = n % count;
  /* The first r slices get q + 1: begin = index*q + min(index, r). */
  offset[dim] = (uint64_t)index * q + (index < r ? index : r);
  extent[dim] = q + (index < r ? 1 : 0);
  return 0;
}
