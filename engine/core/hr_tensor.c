/*
 * hr_tensor: a reference-counted descriptor + host buffers.
 *
 * The count is atomic so that references may move between threads (the
 * engine's worker pool reads tensors while the loop thread holds them);
 * everything else about a tensor is immutable after creation, so no other
 * synchronisation is needed.
 */
#include <stdatomic.h>
#include <string.h>

#include "hr_core.h"

struct hr_tensor {
  atomic_size_t refs;        /* references; the last unref frees */
  hr_mem mem;                /* allocator the tensor was built with */
  hr_descriptor desc;        /* deep copy; ext/params_raw point into `owned` */
  uint8_t *owned;            /* copies of layout.ext and params_raw */
  void *buf[HR_MAX_BUFFERS]; /* buffer k's first byte */
  uint64_t bytes;            /* sum of buffer sizes */
  void *block;               /* library-owned memory (hr_tensor_alloc) */
  hr_release_fn release;     /* application buffers' release (wrap) */
  void *release_ctx;
  hr_tensor **members; /* composite members (references held) */
  size_t member_count;
  unsigned depth; /* composite nesting depth (0: plain) */
  /* Device tensors (hr_tensor_wrap_device): the buffers' device memory
   * and the producer's completion event (borrowed; the release callback
   * hands them back). */
  hr_gpu_buf *gbuf[HR_MAX_BUFFERS];
  hr_gpu_event *gready;
  int on_device;
  int seg_fd;          /* shared segment holding the buffers (-1: none) */
  uint64_t seg_offset; /* buffer 0's offset in it */
  /* Told when the tensor is freed (hr__tensor_watch): pushed with a CAS by
   * any thread holding a reference, read only by the last unref. */
  _Atomic(hr__tensor_watcher *) watchers;
};

struct hr__tensor_watcher {
  hr__tensor_watcher *next;
  hr__tensor_freed_fn fn;
  void *a, *b;
};

int hr__tensor_watch(hr_tensor *t, hr__tensor_freed_fn fn, void *a, void *b) {
  hr__tensor_watcher *head =
      atomic_load_explicit(&t->watchers, memory_order_acquire);
  for (hr__tensor_watcher *w = head; w; w = w->next)
    if (w->fn == fn && w->a == a && w->b == b)
      return 1;
  hr__tensor_watcher *n = hr__mem_calloc(&t->mem, 1, sizeof *n);
  if (!n)
    return HR_ERR_NOMEM;
  n->fn = fn;
  n->a = a;
  n->b = b;
  n->next = head;
  while (!atomic_compare_exchange_weak_explicit(
      &t->watchers, &n->next, n, memory_order_acq_rel, memory_order_acquire)) {
  }
  return 0;
}

void *hr__tensor_release_ctx(const hr_tensor *t, hr_release_fn fn) {
  return t && fn && t->release == fn ? t->release_ctx : NULL;
}

/* Copies `d` into t->desc, deep-copying the bytes its pointers reference
 * into one block owned by the tensor. */
static int copy_descriptor(hr_tensor *t, const hr_descriptor *d) {
  size_t ext = d->layout.ext ? d->layout.ext_len : 0;
  size_t par = d->params_raw ? d->params_len : 0;
  t->desc = *d;
  t->desc.layout.ext = NULL;
  t->desc.params_raw = NULL;
  if (ext + par == 0)
    return 0;
  t->owned = hr__mem_malloc(&t->mem, ext + par);
  if (!t->owned)
    return HR_ERR_NOMEM;
  if (ext) {
    memcpy(t->owned, d->layout.ext, ext);
    t->desc.layout.ext = t->owned;
  }
  if (par) {
    memcpy(t->owned + ext, d->params_raw, par);
    t->desc.params_raw = t->owned + ext;
  }
  return 0;
}

static hr_tensor *tensor_new(const hr_mem *mem) {
  const hr_mem *m = mem ? mem : hr_mem_default();
  hr_tensor *t = hr__mem_calloc(m, 1, sizeof *t);
  if (!t)
    return NULL;
  t->mem = *m;
  t->seg_fd = -1;
  atomic_init(&t->refs, 1);
  atomic_init(&t->watchers, NULL);
  return t;
}

static void tensor_free(hr_tensor *t) {
  hr_mem mem = t->mem;
  /* Watchers first, while the buffers are still the tensor's. */
  hr__tensor_watcher *w =
      atomic_load_explicit(&t->watchers, memory_order_acquire);
  while (w) {
    hr__tensor_watcher *next = w->next;
    w->fn(w->a, w->b, t);
    hr__mem_free(&mem, w);
    w = next;
  }
  for (size_t i = 0; i < t->member_count; i++)
    hr_tensor_unref(t->members[i]);
  hr__mem_free(&mem, t->members);
  if (t->release)
    t->release(t->release_ctx);
  hr__mem_free(&mem, t->block);
  hr__mem_free(&mem, t->owned);
  hr__mem_free(&mem, t);
}

static int plain_args_ok(const hr_descriptor *d) {
  return d->rank <= HR_MAX_RANK && d->buffer_count <= HR_MAX_BUFFERS &&
         d->layout.tag != HR_LAYOUT_COMPOSITE;
}

static int sum_sizes(const hr_descriptor *d, uint64_t *out) {
  uint64_t total = 0;
  for (unsigned k = 0; k < d->buffer_count; k++)
    if (!hr__add_u64(total, d->buffers[k].size_bytes, &total))
      return HR_ERR_INVALID_ARGUMENT;
  *out = total;
  return 0;
}

/* A new tensor holding a copy of the plain descriptor `desc` and its byte
 * count: HR_ERR_INVALID_ARGUMENT when the buffer sizes overflow,
 * HR_ERR_NOMEM. */
static int tensor_for(hr_tensor **out, const hr_descriptor *desc,
                      const hr_mem *mem) {
  uint64_t bytes;
  if (sum_sizes(desc, &bytes))
    return HR_ERR_INVALID_ARGUMENT;
  hr_tensor *t = tensor_new(mem);
  if (!t)
    return HR_ERR_NOMEM;
  if (copy_descriptor(t, desc)) {
    tensor_free(t);
    return HR_ERR_NOMEM;
  }
  t->bytes = bytes;
  *out = t;
  return 0;
}

int hr_tensor_wrap(hr_tensor **out, const hr_descriptor *desc,
                   void *const *buffers, hr_release_fn release,
                   void *release_ctx, const hr_mem *mem) {
  if (!out || !desc || !plain_args_ok(desc) || (desc->buffer_count && !buffers))
    return HR_ERR_INVALID_ARGUMENT;
  for (unsigned k = 0; k < desc->buffer_count; k++)
    if (!buffers[k] && desc->buffers[k].size_bytes)
      return HR_ERR_INVALID_ARGUMENT;
  hr_tensor *t;
  int rv = tensor_for(&t, desc, mem);
  if (rv)
    return rv;
  for (unsigned k = 0; k < desc->buffer_count; k++)
    t->buf[k] = buffers[k];
  /* Only now, when nothing can fail any more, is the release taken over. */
  t->release = release;
  t->release_ctx = release_ctx;
  *out = t;
  return 0;
}

int hr_tensor_wrap_device(hr_tensor **out, const hr_descriptor *desc,
                          hr_gpu_buf *const *bufs, hr_gpu_event *ready,
                          hr_release_fn release, void *release_ctx,
                          const hr_mem *mem) {
  if (!out || !desc || !plain_args_ok(desc) || desc->buffer_count == 0 || !bufs)
    return HR_ERR_INVALID_ARGUMENT;
  void *host[HR_MAX_BUFFERS] = {0};
  for (unsigned k = 0; k < desc->buffer_count; k++) {
    if (!bufs[k] || hr_gpu_buf_size(bufs[k]) < desc->buffers[k].size_bytes)
      return HR_ERR_INVALID_ARGUMENT;
    /* One device per tensor: the staging stream belongs to it. */
    if (hr_gpu_buf_device(bufs[k]) != hr_gpu_buf_device(bufs[0]))
      return HR_ERR_INVALID_ARGUMENT;
    host[k] = hr_gpu_buf_host_ptr(bufs[k]);
  }
  if (ready && hr_gpu_event_device(ready) != hr_gpu_buf_device(bufs[0]))
    return HR_ERR_INVALID_ARGUMENT;
  hr_tensor *t;
  int rv = tensor_for(&t, desc, mem);
  if (rv)
    return rv;
  for (unsigned k = 0; k < desc->buffer_count; k++) {
    t->buf[k] = host[k];
    t->gbuf[k] = bufs[k];
  }
  t->gready = ready;
  t->on_device = 1;
  t->release = release;
  t->release_ctx = release_ctx;
  *out = t;
  return 0;
}

int hr__tensor_shell(hr_tensor **out, const hr_descriptor *desc,
                     const hr_mem *mem) {
  if (!out || !desc || !plain_args_ok(desc))
    return HR_ERR_INVALID_ARGUMENT;
  hr_tensor *t;
  int rv = tensor_for(&t, desc, mem);
  if (rv)
    return rv;
  t->on_device = 1;
  *out = t;
  return 0;
}

hr_gpu_buf *hr_tensor_gpu_buf(const hr_tensor *t, unsigned k) {
  return t && t->on_device && k < t->desc.buffer_count ? t->gbuf[k] : NULL;
}

hr_gpu_event *hr_tensor_gpu_event(const hr_tensor *t) {
  return t && t->on_device ? t->gready : NULL;
}

int hr_tensor_on_device(const hr_tensor *t) {
  return t && t->on_device;
}

int hr__tensor_placement(const hr_descriptor *d, unsigned min_alignment_log2,
                         uint64_t offsets[HR_MAX_BUFFERS], uint64_t *span,
                         uint64_t *base_align) {
  if (d->buffer_count > HR_MAX_BUFFERS ||
      min_alignment_log2 > HR_MAX_ALIGNMENT_LOG2)
    return HR_ERR_INVALID_ARGUMENT;
  uint64_t pos = 0, maxa = 1;
  for (unsigned k = 0; k < d->buffer_count; k++) {
    unsigned lg = d->buffers[k].alignment_log2;
    if (lg > HR_MAX_ALIGNMENT_LOG2)
      return HR_ERR_INVALID_ARGUMENT;
    if (lg < min_alignment_log2)
      lg = min_alignment_log2;
    uint64_t a = (uint64_t)1 << lg;
    if (a > maxa)
      maxa = a;
    if (!hr__add_u64(pos, a - 1, &pos))
      return HR_ERR_INVALID_ARGUMENT;
    pos &= ~(a - 1);
    offsets[k] = pos;
    if (!hr__add_u64(pos, d->buffers[k].size_bytes, &pos))
      return HR_ERR_INVALID_ARGUMENT;
  }
  if (min_alignment_log2 && ((uint64_t)1 << min_alignment_log2) > maxa)
    maxa = (uint64_t)1 << min_alignment_log2;
  *span = pos;
  *base_align = maxa;
  return 0;
}

int hr_tensor_alloc(hr_tensor **out, const hr_descriptor *desc,
                    unsigned min_alignment_log2, const hr_mem *mem) {
  if (!out || !desc || !plain_args_ok(desc))
    return HR_ERR_INVALID_ARGUMENT;
  uint64_t off[HR_MAX_BUFFERS], span, align;
  if (hr__tensor_placement(desc, min_alignment_log2, off, &span, &align))
    return HR_ERR_INVALID_ARGUMENT;
  int huge = span >= HR_HUGE_THRESHOLD;
  if (huge && align < HR_HUGE_THRESHOLD)
    align = HR_HUGE_THRESHOLD;
  /* malloc() already aligns to max_align_t; anything stricter is obtained
   * by over-allocating and rounding the base up. */
  uint64_t pad = align > _Alignof(max_align_t) ? align - 1 : 0;
  uint64_t total;
  if (!hr__add_u64(span, pad, &total) || total > SIZE_MAX)
    return HR_ERR_NOMEM;
  hr_tensor *t;
  int rv = tensor_for(&t, desc, mem);
  if (rv)
    return rv;
  t->block = hr__mem_malloc(&t->mem, (size_t)total);
  if (!t->block)
    goto nomem;
  uintptr_t base = (uintptr_t)t->block;
  base = (base + (uintptr_t)pad) & ~((uintptr_t)align - 1);
  for (unsigned k = 0; k < desc->buffer_count; k++)
    t->buf[k] = (void *)(base + (uintptr_t)off[k]);
  if (huge)
    hr__huge_advise((void *)base, (size_t)span);
  *out = t;
  return 0;
nomem:
  tensor_free(t);
  return HR_ERR_NOMEM;
}

/* ---- composites ---------------------------------------------------------- */

static int is_quant_type(uint8_t e) {
  return e == HR_ELEM_INT8 || e == HR_ELEM_UINT8 || e == HR_ELEM_INT4 ||
         e == HR_ELEM_UINT4 || e == HR_ELEM_FLOAT8_E4M3FN ||
         e == HR_ELEM_FLOAT8_E5M2;
}

static int is_scale_type(uint8_t e) {
  return e == HR_ELEM_FLOAT16 || e == HR_ELEM_BFLOAT16 || e == HR_ELEM_FLOAT32;
}

static int bad(hr_wire_status *st, const char *why) {
  return hr__wire_fail(st, HR_WIRE_COMPOSITE_INVALID, 0, why);
}

/* Member `m` has the head's shape except along `axis`, where it has
 * `axis_dim`. */
static int shape_like(const hr_descriptor *h, const hr_descriptor *m,
                      unsigned axis, uint64_t axis_dim) {
  if (m->rank != h->rank)
    return 0;
  for (unsigned k = 0; k < h->rank; k++)
    if (m->shape[k] != (k == axis ? axis_dim : h->shape[k]))
      return 0;
  return 1;
}

int hr__composite_check(const hr_descriptor *head,
                        const hr_descriptor *const *members, size_t n,
                        unsigned member_depth, hr_wire_status *st) {
  const hr_layout_params *p = &head->params;
  if (head->layout.tag != HR_LAYOUT_COMPOSITE)
    return bad(st, "composite head: layout is not COMPOSITE");
  if (p->member_count < 1 || p->member_count != n ||
      n > HR_MAX_COMPOSITE_MEMBERS)
    return bad(st, "composite head: member_count does not match members");
  if (member_depth + 1 > HR_MAX_COMPOSITE_DEPTH)
    return bad(st, "composite: nesting deeper than 8");
  for (size_t i = 0; i < n; i++)
    if (members[i]->flags & HR_DESC_HAS_SHARD)
      return bad(st, "composite member: a member is never a shard");
  switch (p->rule) {
  case HR_COMPOSITE_TUPLE:
    if (head->element_type != HR_ELEM_NONE || head->rank != 0)
      return bad(st, "TUPLE head: element type NONE and rank 0 required");
    return 0;
  case HR_COMPOSITE_CONCAT: {
    if (head->element_type == HR_ELEM_NONE || p->axis >= head->rank)
      return bad(st, "CONCAT head: bad element type or axis");
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
      const hr_descriptor *m = members[i];
      if (m->element_type != head->element_type ||
          !shape_like(head, m, p->axis,
                      m->rank == head->rank ? m->shape[p->axis] : 0) ||
          !hr__add_u64(sum, m->shape[p->axis], &sum))
        return bad(st, "CONCAT member: type, rank or shape differs");
    }
    if (sum != head->shape[p->axis])
      return bad(st, "CONCAT: sizes along axis do not sum to the head's");
    return 0;
  }
  case HR_COMPOSITE_GROUP_QUANTIZED: {
    if (head->element_type == HR_ELEM_NONE || p->axis >= head->rank ||
        p->group_size < 1 || p->has_zero_point > 1)
      return bad(st, "GROUP_QUANTIZED head: bad parameters");
    if (n != 2u + p->has_zero_point)
      return bad(st, "GROUP_QUANTIZED: member_count != 2 + has_zero_point");
    uint64_t dim = head->shape[p->axis];
    uint64_t groups = dim / p->group_size + (dim % p->group_size != 0);
    const hr_descriptor *q = members[0], *s = members[1];
    if (!is_quant_type(q->element_type) || !shape_like(head, q, p->axis, dim))
      return bad(st, "GROUP_QUANTIZED member 0: type or shape");
    if (!is_scale_type(s->element_type) ||
        !shape_like(head, s, p->axis, groups))
      return bad(st, "GROUP_QUANTIZED member 1 (scales): type or shape");
    if (n == 3 && (members[2]->element_type != q->element_type ||
                   !shape_like(head, members[2], p->axis, groups)))
      return bad(st, "GROUP_QUANTIZED member 2 (zero points): type or shape");
    return 0;
  }
  default:
    return bad(st, "composite head: unknown rule");
  }
}

int hr_tensor_new_composite(hr_tensor **out, const hr_descriptor *head,
                            hr_tensor *const *members, size_t n,
                            const hr_mem *mem, hr_wire_status *st) {
  if (!out || !head || (n && !members) || head->rank > HR_MAX_RANK ||
      head->layout.tag != HR_LAYOUT_COMPOSITE || head->buffer_count != 0)
    return HR_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < n; i++)
    if (!members[i])
      return HR_ERR_INVALID_ARGUMENT;
  if (n > HR_MAX_COMPOSITE_MEMBERS)
    return bad(st, "composite: more than 65,535 members");
  const hr_mem *m = mem ? mem : hr_mem_default();
  const hr_descriptor **descs = hr__mem_malloc(m, n * sizeof *descs);
  if (!descs)
    return HR_ERR_NOMEM;
  unsigned depth = 0;
  for (size_t i = 0; i < n; i++) {
    descs[i] = &members[i]->desc;
    if (members[i]->depth > depth)
      depth = members[i]->depth;
  }
  int rv = hr__composite_check(head, descs, n, depth, st);
  hr__mem_free(m, descs);
  if (rv)
    return rv;
  hr_tensor *t = tensor_new(m);
  if (!t)
    return HR_ERR_NOMEM;
  if (copy_descriptor(t, head))
    goto nomem;
  t->members = hr__mem_malloc(&t->mem, n * sizeof *t->members);
  if (!t->members)
    goto nomem;
  for (size_t i = 0; i < n; i++)
    t->members[i] = hr_tensor_ref(members[i]);
  t->member_count = n;
  t->depth = depth + 1;
  *out = t;
  return 0;
nomem:
  tensor_free(t);
  return HR_ERR_NOMEM;
}

/* ---- references and accessors ------------------------------------------- */

hr_tensor *hr_tensor_ref(hr_tensor *t) {
  if (t)
    atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
  return t;
}

void hr_tensor_unref(hr_tensor *t) {
  if (!t)
    return;
  /* Acquire-release on every drop: whatever another thread wrote through
   * its reference happens-before the release callback.  (Not release plus
   * an acquire fence: ThreadSanitizer does not model fences, and tensors
   * handed between threads in-process are dropped on either side; on x86
   * and ARMv8.1 the cost is the same.) */
  if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
    tensor_free(t);
}

const hr_descriptor *hr_tensor_descriptor(const hr_tensor *t) {
  return t ? &t->desc : NULL;
}

void *hr_tensor_buffer(const hr_tensor *t, unsigned k) {
  return t && k < t->desc.buffer_count ? t->buf[k] : NULL;
}

uint64_t hr_tensor_bytes(const hr_tensor *t) {
  return t ? t->bytes : 0;
}

size_t hr_tensor_member_count(const hr_tensor *t) {
  return t ? t->member_count : 0;
}

hr_tensor *hr_tensor_member(const hr_tensor *t, size_t i) {
  return t && i < t->member_count ? t->members[i] : NULL;
}

unsigned hr__tensor_depth(const hr_tensor *t) {
  return t->depth;
}

void hr__tensor_set_release(hr_tensor *t, hr_release_fn fn, void *ctx) {
  t->release = fn;
  t->release_ctx = ctx;
}

/* ---- shared segments ----------------------------------------------------- */

int hr_tensor_set_segment(hr_tensor *t, int fd, uint64_t byte_offset) {
  if (!t || fd < 0 || t->member_count ||
      t->desc.layout.tag == HR_LAYOUT_COMPOSITE)
    return HR_ERR_INVALID_ARGUMENT;
  /* The peer finds buffer k > 0 by § 7.1 alone: where it starts must
   * agree with where it lies in our memory. */
  uint64_t pos = byte_offset;
  for (unsigned k = 0; k < t->desc.buffer_count; k++) {
    uint64_t a = (uint64_t)1 << t->desc.buffers[k].alignment_log2;
    if (k > 0) {
      if (!hr__add_u64(pos, a - 1, &pos))
        return HR_ERR_INVALID_ARGUMENT;
      pos &= ~(a - 1);
      if ((uintptr_t)t->buf[k] - (uintptr_t)t->buf[0] != pos - byte_offset)
        return HR_ERR_INVALID_ARGUMENT;
    } else if (pos % a) {
      return HR_ERR_INVALID_ARGUMENT;
    }
    if (!hr__add_u64(pos, t->desc.buffers[k].size_bytes, &pos))
      return HR_ERR_INVALID_ARGUMENT;
  }
  t->seg_fd = fd;
  t->seg_offset = byte_offset;
  return 0;
}

int hr_tensor_segment(const hr_tensor *t, int *fd, uint64_t *byte_offset) {
  if (!t || t->seg_fd < 0)
    return 0;
  if (fd)
    *fd = t->seg_fd;
  if (byte_offset)
    *byte_offset = t->seg_offset;
  return 1;
}
