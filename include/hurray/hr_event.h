/*
 * libhurray: the libevent binding.
 *
 * Runs an hr_engine on the host's own libevent loop.  The binding is
 * built only on the public external-loop interface (hr_loop_ops in
 * <hurray/engine.h>): libevent reports readiness and the engine's single
 * timer; tensor bytes are moved by the engine's own recv()/writev() calls,
 * never through bufferevents.
 *
 * The host creates, runs and frees its event_base; the binding never
 * creates one.  Every engine callback runs on the thread that runs the
 * base (event_base_dispatch/event_base_loop).  This is the only public
 * header that includes <event2/...>.
 */
#ifndef HURRAY_HR_EVENT_H
#define HURRAY_HR_EVENT_H

#include <event2/event.h>

#include <hurray/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Creates an engine attached to `base` (which must outlive it).  `cfg`
 * (NULL: defaults) and `mem` (NULL: libc) are as for hr_engine_new().
 * The engine is freed with hr_engine_del() as usual, which also detaches
 * it from the base (every event it added is deleted).  Must be called on
 * the loop's thread, like every engine call.
 *
 * Timers: deadlines under 1 ms (the RDMA data plane's polls on a provider
 * without a wait object, 50 us apart while a transfer runs) are armed on
 * a timerfd on Linux, opened on first use and closed by hr_engine_del(),
 * because libevent's epoll backend rounds timeouts up to whole
 * milliseconds unless the base has EVENT_BASE_FLAG_PRECISE_TIMER; longer
 * deadlines use a libevent timer.
 *
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL out or base), HR_ERR_NOMEM,
 * HR_ERR_IO (libevent refused an event), or hr_engine_new()'s errors.
 */
HR_EXTERN int hr_ev_attach(hr_engine **out, struct event_base *base,
                           const hr_engine_config *cfg, const hr_mem *mem);

/* ---- the metrics endpoint (<hurray/metrics.h>) ---- */

typedef struct hr_metrics hr_metrics;
typedef struct hr_ev_metrics hr_ev_metrics;

/*
 * Serves the registry `m` over HTTP with libevent's evhttp on `base`:
 * GET (or HEAD) /metrics answers 200 with hr_metrics_render()'s text,
 * content type "text/plain; version=0.0.4; charset=utf-8"; other paths
 * get 404, other methods 405.  Before each scrape the gauges are sampled
 * from `engine` (hr_metrics_sample(); NULL: not sampled).  `addr` is
 * "HOST:PORT" or "[v6]:PORT"; port 0 picks one (hr_ev_metrics_port()).
 * Requests that stall are dropped after 10 s.  `m`, `engine` and `base`
 * must outlive the endpoint; it runs on the base's thread, like the
 * engine.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL argument, a bad
 * address), HR_ERR_IO (bind/listen: errno says why), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_ev_metrics_listen(hr_ev_metrics **out,
                                   struct event_base *base, hr_metrics *m,
                                   const hr_engine *engine, const char *addr,
                                   const hr_mem *mem);
/* The bound TCP port. */
HR_EXTERN int hr_ev_metrics_port(const hr_ev_metrics *s);
/* Stops serving and frees the endpoint (requests in progress are
 * dropped).  NULL is a no-op. */
HR_EXTERN void hr_ev_metrics_close(hr_ev_metrics *s);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_HR_EVENT_H */
