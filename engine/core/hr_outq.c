/*
 * The output queue: what hr_session_pull() hands to the host.
 *
 * Items are appended at the tail and never move, so iovecs handed out stay
 * valid while new items are queued (a PONG queued by recv() between a pull
 * and its consumed()).  Control messages are encoded into the item (inline
 * when small); a data frame is a 24-byte prefix plus a pointer into tensor
 * memory that the item holds a reference on, so tensor bytes are never
 * copied.
 *
 * Scheduling (hr__schedule) runs one round per pull: connection-level
 * control messages were already queued when they arose; then every ready
 * stream, in ready-list order, gets one turn of at most one data frame.
 * Streams that never had a turn sit at the head of the list, so a small
 * request waits behind at most the frame already handed out.  Frames stop
 * being queued once send_budget bytes of them wait to be consumed.
 */
#include <string.h>

#include "hr_session_int.h"

static hr_oitem *item_new(hr_session *s) {
  hr_oitem *it = s->spare_items;
  if (!it)
    return hr__mem_calloc(&s->mem, 1, sizeof *it);
  s->spare_items = it->next;
  s->nspare_items--;
  memset(it, 0, sizeof *it);
  return it;
}

static void item_append(hr_session *s, hr_oitem *it) {
  if (s->qtail)
    s->qtail->next = it;
  else
    s->qhead = it;
  s->qtail = it;
  if (it->is_frame)
    s->frame_queued += it->l1 + it->l2;
  if (it->ctrl)
    s->ctrl_queued += it->l1;
}

static void item_free(hr_session *s, hr_oitem *it) {
  if (it->ping)
    it->ping->item = NULL;
  hr_tensor_unref(it->hold);
  hr__mem_free(&s->mem, it->heap);
  if (s->nspare_items < HR_SPARE_MAX) {
    it->next = s->spare_items;
    s->spare_items = it;
    s->nspare_items++;
    return;
  }
  hr__mem_free(&s->mem, it);
}

void hr__out_free_spares(hr_session *s) {
  while (s->spare_items) {
    hr_oitem *it = s->spare_items;
    s->spare_items = it->next;
    hr__mem_free(&s->mem, it);
  }
  s->nspare_items = 0;
}

int hr__out_msg(hr_session *s, const hr_msg *m, int ctrl) {
  int64_t n = hr_wire_encoded_size(m);
  if (n < 0)
    return HR_ERR_INTERNAL;
  hr_oitem *it = item_new(s);
  if (!it)
    return HR_ERR_NOMEM;
  uint8_t *dst = it->inl;
  if ((size_t)n > sizeof it->inl) {
    it->heap = hr__mem_malloc(&s->mem, (size_t)n);
    if (!it->heap) {
      hr__mem_free(&s->mem, it);
      return HR_ERR_NOMEM;
    }
    dst = it->heap;
  }
  if (hr_wire_encode(m, dst, (size_t)n) != n) {
    item_free(s, it);
    return HR_ERR_INTERNAL;
  }
  it->p1 = dst;
  it->l1 = (size_t)n;
  it->ctrl = ctrl;
  item_append(s, it);
  return 0;
}

int hr__out_msg_fd(hr_session *s, const hr_msg *m, int fd) {
  int rv = hr__out_msg(s, m, 0);
  if (rv == 0) {
    s->qtail->has_fd = 1;
    s->qtail->fd = fd;
  }
  return rv;
}

int hr__out_bytes(hr_session *s, uint8_t *heap, size_t len, int is_frame) {
  hr_oitem *it = item_new(s);
  if (!it)
    return HR_ERR_NOMEM;
  it->heap = heap;
  it->p1 = heap;
  it->l1 = len;
  it->is_frame = is_frame;
  item_append(s, it);
  return 0;
}

int hr__out_frame(hr_session *s, uint32_t stream_id, uint8_t bi, uint64_t off,
                  const uint8_t *data, uint32_t len, hr_tensor *hold) {
  hr_oitem *it = item_new(s);
  if (!it)
    return HR_ERR_NOMEM;
  hr_wire_encode_data_prefix(it->inl, stream_id, bi, off, len);
  it->p1 = it->inl;
  it->l1 = 24;
  it->p2 = data;
  it->l2 = len;
  it->hold = hr_tensor_ref(hold);
  it->is_frame = 1;
  item_append(s, it);
  return 0;
}

int hr__out_error(hr_session *s, uint32_t stream_id, uint32_t code,
                  const char *text) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_ERROR;
  m.hdr.stream_id = stream_id;
  m.u.error.code = code;
  size_t n = text ? strlen(text) : 0;
  if (n > HR_MAX_TEXT)
    n = HR_MAX_TEXT;
  /* Cut on a character boundary so the text stays valid UTF-8. */
  while (n && !hr_utf8_valid((const uint8_t *)text, n))
    n--;
  m.u.error.message = (const uint8_t *)text;
  m.u.error.message_len = (uint16_t)n;
  return hr__out_msg(s, &m, 1);
}

int hr__out_empty(hr_session *s, uint32_t type, uint32_t stream_id) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  m.hdr.stream_id = stream_id;
  return hr__out_msg(s, &m, 0);
}

void hr__out_clear(hr_session *s) {
  hr_oitem *it;

  hr__io_fence_tx(s);
  it = s->qhead;
  while (it) {
    hr_oitem *next = it->next;
    item_free(s, it);
    it = next;
  }
  s->qhead = s->qtail = NULL;
  s->qoff = 0;
  s->frame_queued = 0;
  s->ctrl_queued = 0;
}

int hr__out_iov(hr_session *s, hr_iov *iov, int max) {
  int n = 0;
  size_t skip = s->qoff; /* only the head item is partly consumed */
  /* A descriptor rides on the first byte of one write: a pull starts
   * with the item that carries it, or stops before it. */
  s->pull_fd = -1;
  if (s->qhead && s->qhead->has_fd && s->qoff == 0)
    s->pull_fd = s->qhead->fd;
  for (hr_oitem *it = s->qhead; it && n < max; it = it->next) {
    if (it->has_fd && it != s->qhead)
      break;
    if (it->ping && !it->ping->stamped) {
      /* The round trip starts when the PING leaves for the wire. */
      it->ping->sent = s->now;
      it->ping->stamped = 1;
    }
    size_t s1 = skip < it->l1 ? skip : it->l1;
    skip -= s1;
    if (it->l1 > s1) {
      iov[n].base = it->p1 + s1;
      iov[n].len = it->l1 - s1;
      n++;
    }
    if (it->l2 > skip && n < max) {
      iov[n].base = it->p2 + skip;
      iov[n].len = it->l2 - skip;
      n++;
    }
    skip = 0;
  }
  return n;
}

void hr__out_consume(hr_session *s, size_t n) {
  while (n && s->qhead) {
    hr_oitem *it = s->qhead;
    size_t total = it->l1 + it->l2;
    size_t left = total - s->qoff;
    if (n < left) {
      s->qoff += n;
      return;
    }
    n -= left;
    s->qhead = it->next;
    if (!s->qhead)
      s->qtail = NULL;
    s->qoff = 0;
    if (it->is_frame)
      s->frame_queued -= total;
    if (it->ctrl)
      s->ctrl_queued -= it->l1;
    item_free(s, it);
  }
}

int hr__out_pending(const hr_session *s) { return s->qhead != NULL; }

/* ---- ready list ---------------------------------------------------------- */

void hr__ready_add(hr_session *s, hr_stream *st) {
  if (st->in_ready || st->ended)
    return;
  st->in_ready = 1;
  if (!st->sent_any) {
    /* Never served: go first, ahead of streams that already had turns. */
    st->rprev = NULL;
    st->rnext = s->rhead;
    if (s->rhead)
      s->rhead->rprev = st;
    else
      s->rtail = st;
    s->rhead = st;
    return;
  }
  st->rnext = NULL;
  st->rprev = s->rtail;
  if (s->rtail)
    s->rtail->rnext = st;
  else
    s->rhead = st;
  s->rtail = st;
}

void hr__ready_remove(hr_session *s, hr_stream *st) {
  if (!st->in_ready)
    return;
  if (st->rprev)
    st->rprev->rnext = st->rnext;
  else
    s->rhead = st->rnext;
  if (st->rnext)
    st->rnext->rprev = st->rprev;
  else
    s->rtail = st->rprev;
  st->rnext = st->rprev = NULL;
  st->in_ready = 0;
}

int hr__schedule(hr_session *s) {
  if (s->state == HR_CS_CLOSED || s->state == HR_CS_AWAIT_HELLO)
    return 0;
  size_t round = 0;
  for (hr_stream *st = s->rhead; st; st = st->rnext)
    round++;
  while (round-- && s->rhead) {
    hr_stream *st = s->rhead;
    int more = 0, budget_hit = 0;
    hr__ready_remove(s, st);
    st->sent_any = 1;
    int rv = hr__tx_turn(s, st, &more, &budget_hit);
    if (rv < 0)
      return rv;
    if (budget_hit) {
      /* Keep its place: it goes first once the host consumes. */
      st->sent_any = 0;
      hr__ready_add(s, st);
      st->sent_any = 1;
      break;
    }
    if (rv == 1) {
      rv = hr__stream_sent(s, st);
      if (rv < 0)
        return rv;
      continue;
    }
    if (more)
      hr__ready_add(s, st);
    if (s->state == HR_CS_CLOSED)
      break;
  }
  return 0;
}

int hr_session_pull_fd(const hr_session *s) { return s ? s->pull_fd : -1; }
