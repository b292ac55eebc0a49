/*
 * The operation queue of the worker-thread backends (hr_gpu_opq.h).
 */
#include <string.h>

#include "hr_gpu_opq.h"

int hr__gpu_opq_init(hr__gpu_opq *q, const hr_mem *mem,
                     const hr__gpu_opq_cbs *cbs) {
  q->mem = *mem;
  q->cbs = cbs;
  if (pthread_mutex_init(&q->mu, NULL) != 0)
    return HR_ERR_IO;
  if (pthread_cond_init(&q->cv, NULL) != 0) {
    pthread_mutex_destroy(&q->mu);
    return HR_ERR_IO;
  }
  return 0;
}

void hr__gpu_opq_fini(hr__gpu_opq *q) {
  pthread_cond_destroy(&q->cv);
  pthread_mutex_destroy(&q->mu);
}

hr__gpu_qstream *hr__gpu_opq_stream_real(void *sp) {
  hr__gpu_qstream *s = sp;
  return s->target ? s->target : s;
}

hr__gpu_qevent *hr__gpu_opq_event_real(void *ep) {
  hr__gpu_qevent *e = ep;
  return e->target ? e->target : e;
}

void hr__gpu_opq_point_unref_locked(hr__gpu_opq *q, hr__gpu_qpoint *p) {
  if (!p || --p->refs > 0)
    return;
  if (q->cbs->point_fini)
    q->cbs->point_fini(q, p);
  hr__mem_free(&q->mem, p);
}

void hr__gpu_opq_point_wait_locked(hr__gpu_opq *q, hr__gpu_qpoint *p) {
  while (!p->reached)
    pthread_cond_wait(&q->cv, &q->mu);
}

/* The stream's thread: executes the queue in order until told to stop
 * with nothing left queued. */
static void *stream_main(void *arg) {
  hr__gpu_qstream *s = arg;
  hr__gpu_opq *q = s->q;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!s->head && !s->stop)
      pthread_cond_wait(&q->cv, &q->mu);
    if (!s->head)
      break;
    hr__gpu_qop *op = s->head;
    q->cbs->exec(s, op);
    s->head = op->next;
    if (!s->head)
      s->tail = NULL;
    hr__gpu_opq_point_unref_locked(q, op->point);
    if (q->cbs->op_fini)
      q->cbs->op_fini(s, op);
    hr__mem_free(&q->mem, op);
    s->completed++;
    pthread_cond_broadcast(&q->cv);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

int hr__gpu_opq_stream_start(hr__gpu_opq *q, hr__gpu_qstream *s) {
  s->q = q;
  return pthread_create(&s->thread, NULL, stream_main, s) == 0 ? 0 : HR_ERR_IO;
}

void hr__gpu_opq_stream_stop(hr__gpu_qstream *s) {
  hr__gpu_opq *q = s->q;
  pthread_mutex_lock(&q->mu);
  s->stop = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  pthread_join(s->thread, NULL);
}

void hr__gpu_opq_stream_idle_locked(hr__gpu_qstream *s) {
  hr__gpu_opq *q = s->q;
  uint64_t target = s->enqueued;
  while (s->completed < target)
    pthread_cond_wait(&q->cv, &q->mu);
}

hr__gpu_qop *hr__gpu_opq_op_new(hr__gpu_opq *q, int kind) {
  hr__gpu_qop *op = hr__mem_calloc(&q->mem, 1, q->cbs->op_size);
  if (op)
    op->kind = kind;
  return op;
}

/* Appends an op; q->mu held. */
static void enqueue(hr__gpu_opq *q, hr__gpu_qstream *s, hr__gpu_qop *op) {
  op->next = NULL;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  s->enqueued++;
  pthread_cond_broadcast(&q->cv);
}

void hr__gpu_opq_push(hr__gpu_opq *q, void *sp, hr__gpu_qop *op) {
  pthread_mutex_lock(&q->mu);
  enqueue(q, hr__gpu_opq_stream_real(sp), op);
  pthread_mutex_unlock(&q->mu);
}

int hr__gpu_opq_event_new(void *dev, unsigned flags, void **out) {
  hr__gpu_opq *q = dev;
  (void)flags;
  hr__gpu_qevent *e = hr__mem_calloc(&q->mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  *out = e;
  return 0;
}

void hr__gpu_opq_event_del(void *dev, void *ep) {
  hr__gpu_opq *q = dev;
  hr__gpu_qevent *e = ep;
  pthread_mutex_lock(&q->mu);
  if (!e->target)
    hr__gpu_opq_point_unref_locked(q, e->last);
  pthread_mutex_unlock(&q->mu);
  hr__mem_free(&q->mem, e);
}

int hr__gpu_opq_event_record(void *dev, void *ep, void *sp) {
  hr__gpu_opq *q = dev;
  hr__gpu_qevent *e = hr__gpu_opq_event_real(ep);
  hr__gpu_qop *op = hr__gpu_opq_op_new(q, HR__GPU_OP_RECORD);
  hr__gpu_qpoint *p = hr__mem_calloc(&q->mem, 1, q->cbs->point_size);
  if (!op || !p) {
    hr__mem_free(&q->mem, op);
    hr__mem_free(&q->mem, p);
    return HR_ERR_NOMEM;
  }
  pthread_mutex_lock(&q->mu);
  p->refs = 2; /* the event and the op */
  hr__gpu_opq_point_unref_locked(q, e->last);
  e->last = p;
  op->point = p;
  enqueue(q, hr__gpu_opq_stream_real(sp), op);
  pthread_mutex_unlock(&q->mu);
  return 0;
}

int hr__gpu_opq_stream_wait_event(void *dev, void *sp, void *ep) {
  hr__gpu_opq *q = dev;
  hr__gpu_qevent *e = hr__gpu_opq_event_real(ep);
  hr__gpu_qop *op = hr__gpu_opq_op_new(q, HR__GPU_OP_WAIT);
  if (!op)
    return HR_ERR_NOMEM;
  pthread_mutex_lock(&q->mu);
  if (!e->last) { /* never recorded: nothing to wait for */
    pthread_mutex_unlock(&q->mu);
    hr__mem_free(&q->mem, op);
    return 0;
  }
  op->point = e->last;
  e->last->refs++;
  enqueue(q, hr__gpu_opq_stream_real(sp), op);
  pthread_mutex_unlock(&q->mu);
  return 0;
}

hr__gpu_qpoint *hr__gpu_opq_event_reach(hr__gpu_opq *q, void *ep) {
  hr__gpu_qevent *e = hr__gpu_opq_event_real(ep);
  pthread_mutex_lock(&q->mu);
  hr__gpu_qpoint *p = e->last;
  if (p) {
    p->refs++;
    hr__gpu_opq_point_wait_locked(q, p);
  }
  pthread_mutex_unlock(&q->mu);
  return p;
}

int hr__gpu_opq_host_fn(void *dev, void *sp, hr_gpu_host_fn fn, void *arg) {
  hr__gpu_opq *q = dev;
  hr__gpu_qop *op = hr__gpu_opq_op_new(q, HR__GPU_OP_HOST_FN);
  if (!op)
    return HR_ERR_NOMEM;
  op->fn = fn;
  op->arg = arg;
  hr__gpu_opq_push(q, sp, op);
  return 0;
}

void *hr__gpu_opq_native(void *dev, int what, void *obj) {
  (void)dev;
  if (what == HR_GPU_OBJ_STREAM)
    return hr__gpu_opq_stream_real(obj);
  return hr__gpu_opq_event_real(obj);
}

int hr__gpu_opq_wrap_native(void *dev, int what, void *native, void **out) {
  hr__gpu_opq *q = dev;
  if (what == HR_GPU_OBJ_STREAM) {
    hr__gpu_qstream *s = hr__mem_calloc(&q->mem, 1, q->cbs->stream_size);
    if (!s)
      return HR_ERR_NOMEM;
    s->q = q;
    s->target = hr__gpu_opq_stream_real(native);
    *out = s;
  } else {
    hr__gpu_qevent *e = hr__mem_calloc(&q->mem, 1, sizeof *e);
    if (!e)
      return HR_ERR_NOMEM;
    e->target = hr__gpu_opq_event_real(native);
    *out = e;
  }
  return 0;
}
