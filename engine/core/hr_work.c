/*
 * What the session's work items share: their submission to the host, and
 * the two ends of a device-copy item (its `start`, completed by the
 * device's host function, and its `run`, which waits on the calling
 * thread).  The items themselves stay with their users (hr_send.c,
 * hr_devrx.c, hr_rdma_stage.c), which differ in what they enqueue and in
 * what a failure means.
 */
#include "hr_session_int.h"

void hr__work_submit(hr_session *s, hr_work *w) {
  s->works_inflight++;
  if (s->cbs.submit_work) {
    hr__cb_enter(s);
    int rv = s->cbs.submit_work(s, w, s->ud);
    hr__cb_leave(s);
    if (rv == 0)
      return;
    /* The host could not take it: run it here rather than fail. */
  }
  w->run(w);
  w->done(w);
}

/* The device's completion thread reached the item's end. */
static void gpu_work_landed(void *arg) {
  hr_gpu_work *g = arg;
  g->complete(g->w, g->complete_ctx);
}

int hr__gpu_work_start(hr_gpu_work *g, hr_work *w, hr_gpu_stream *gs,
                       int (*enqueue)(hr_work *w),
                       void (*complete)(hr_work *w, void *ctx), void *ctx,
                       int *failed) {
  g->w = w;
  g->complete = complete;
  g->complete_ctx = ctx;
  int rv = enqueue ? enqueue(w) : 0;
  if (rv == 0)
    rv = hr_gpu_launch_host_fn(gs, gpu_work_landed, g);
  if (rv && failed)
    *failed = rv;
  return rv;
}

int hr__gpu_work_run(hr_work *w, hr_gpu_stream *gs,
                     int (*enqueue)(hr_work *w)) {
  int rv = enqueue ? enqueue(w) : 0;
  return rv ? rv : hr__gpu_stream_wait(gs);
}
