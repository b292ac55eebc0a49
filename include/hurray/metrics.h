/*
 * libhurray: metrics and request logs for servers that embed the engine.
 *
 * An hr_metrics is a registry the application owns (one per engine, or one
 * shared by several engines on the same loop thread).  It is fed from the
 * engine's events (hr_metrics_attach() installs the engine callbacks, or
 * the application calls hr_metrics_record() / hr_metrics_conn() from its
 * own), renders the Prometheus text exposition format (version 0.0.4) with
 * hr_metrics_render(), and writes one structured log line per request to a
 * callback the application routes to its own logger.
 *
 * Log lines are JSON objects, one per line (JSON Lines), with at least
 * "ts" (UTC, RFC 3339 with milliseconds), "level" and "event"; a request
 * line adds "peer", "kind", "key" (or "key_hex" when the key is not
 * UTF-8), "stream", "layout", "transcoded", "plane", "bytes",
 * "duration_ms", "result" ("fallback", "shard" and "shards" when they
 * apply), and when it failed "error", "error_sent" and
 * "message".  docs/internals/operations.md lists every field and metric.
 *
 * Threads: an hr_metrics is not locked.  Every call on one registry must
 * come from one thread at a time: the engine's loop thread, where the
 * engine callbacks and the libevent endpoint (hr_ev_metrics_listen() in
 * <hurray/hr_event.h>) run.
 */
#ifndef HURRAY_METRICS_H
#define HURRAY_METRICS_H

#include <hurray/common.h>
#include <hurray/engine.h>
#include <hurray/session.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_metrics hr_metrics;

/* Log levels, most severe first: a line is written when its level is at
 * most the configured one. */
enum hr_log_level {
  HR_LOG_ERROR = 0,
  HR_LOG_WARN = 1,
  HR_LOG_INFO = 2,
  HR_LOG_DEBUG = 3
};

/* Receives one complete log line (`len` bytes, no newline; line[len] is
 * 0), valid during the call only.  Called on the registry's thread. */
typedef void (*hr_log_fn)(int level, const char *line, size_t len,
                          void *user_data);

/* Most latency buckets a registry takes. */
#define HR_METRICS_MAX_BUCKETS 32

typedef struct hr_metrics_config {
  size_t size; /* sizeof(hr_metrics_config) */
  /* Upper bounds of the latency histograms' buckets in seconds, strictly
   * ascending, finite and positive; +Inf is added.  NULL: the default
   * 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
   * 2.5, 5, 10, 30, 60.  Copied. */
  const double *latency_buckets;
  size_t latency_bucket_count; /* 1 to HR_METRICS_MAX_BUCKETS */
  /* A label put on every sample (NULL: none), e.g. "instance".  The name
   * must match [a-zA-Z_][a-zA-Z0-9_]* and not start with "__"; the value
   * is any UTF-8 text (escaped on output).  Copied. */
  const char *const_label_name;
  const char *const_label_value;
  /* Where log lines go (NULL: no logs) and the most verbose level
   * written (HR_LOG_INFO by default). */
  hr_log_fn log;
  void *log_user_data;
  int log_level;
} hr_metrics_config;

/* Fills `c` with the defaults above. */
HR_EXTERN void hr_metrics_config_default(hr_metrics_config *c);

/* Creates a registry (`cfg` NULL: defaults; `mem` NULL: libc).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (NULL out, bad buckets, a bad label name or a
 * value that is not UTF-8, a level out of range), HR_ERR_NOMEM. */
HR_EXTERN int hr_metrics_new(hr_metrics **out, const hr_metrics_config *cfg,
                             const hr_mem *mem);
/* Frees the registry.  An engine it is attached to must not report to it
 * any more (free the engine first).  NULL is a no-op. */
HR_EXTERN void hr_metrics_del(hr_metrics *m);

/* Changes the log level (e.g. on a signal).  Returns 0 or
 * HR_ERR_INVALID_ARGUMENT. */
HR_EXTERN int hr_metrics_set_log_level(hr_metrics *m, int level);
/* Parses "error", "warn", "info" or "debug" into *level.  Returns 0 or
 * HR_ERR_INVALID_ARGUMENT. */
HR_EXTERN int hr_log_level_parse(const char *name, int *level);

/* ---- feeding ------------------------------------------------------------ */

/*
 * Counts one finished request and logs it.  `rec` is a server record
 * (engine on_transfer or on_request): a GET's bytes count as sent, a
 * PUT's as received, on rec->data_plane.  `peer` (NULL: unknown) is the
 * peer's address (hr_conn_peer()).  A client record (transcoded -1) is
 * counted the other way round (a GET's bytes received, a PUT's sent).
 * Records of other kinds count as requests only.
 */
HR_EXTERN void hr_metrics_record(hr_metrics *m, const char *peer,
                                 const hr_transfer_record *rec);

/*
 * Counts a connection event (HR_CONN_OPENED, _CLOSED, _REJECTED; others
 * are ignored) and logs it at debug level (a close with an error, and a
 * rejection, at warn).  For HR_CONN_CLOSED, `wire_error` / `sent` are the
 * connection-level ERROR (hr_conn_error(); 0: none) and counted in
 * hurray_errors_total{scope="connection"}.
 */
HR_EXTERN void hr_metrics_conn(hr_metrics *m, const char *peer, int event,
                               uint32_t wire_error, int sent);

/* Sets the gauges of open connections and streams.  hr_metrics_sample()
 * does it from an engine; the libevent endpoint does it before each
 * scrape. */
HR_EXTERN void hr_metrics_set_active(hr_metrics *m, uint64_t connections,
                                     uint64_t streams);
HR_EXTERN void hr_metrics_sample(hr_metrics *m, const hr_engine *e);

/*
 * Makes an engine feed the registry: sets cfg->on_transfer, on_request and
 * on_conn to the registry's handlers and cfg->user_data to the registry,
 * keeping the callbacks and user_data found in *cfg (on_wakeup too),
 * which run after the registry's with the user_data they had.  Call it on the
 * config before hr_engine_new() / hr_ev_attach(); `m` must outlive the engine.
 * One registry can be attached to one config only (a second call returns
 * HR_ERR_STATE).  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_STATE.
 */
HR_EXTERN int hr_metrics_attach(hr_metrics *m, hr_engine_config *cfg);

/* ---- logging ------------------------------------------------------------ */

/* Writes a free-form line {"ts":..,"level":..,"event":`event`,"msg":..}
 * through the registry's log callback when `level` passes (printf
 * format; the text is escaped as a JSON string, cut at 4 KiB, and bytes
 * that are not UTF-8 become '?'; `event` NULL or not UTF-8: "log"). */
HR_EXTERN void hr_metrics_log(hr_metrics *m, int level, const char *event,
                              const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- exposition --------------------------------------------------------- */

/* Receives the rendered text in pieces; return 0, or non-zero to stop the
 * rendering (hr_metrics_render() then returns HR_ERR_CALLBACK_FAILURE). */
typedef int (*hr_metrics_write_fn)(const char *text, size_t len,
                                   void *user_data);

/*
 * Renders every metric in the Prometheus text format 0.0.4 (HELP and TYPE
 * lines, label values escaped; content type "text/plain; version=0.0.4").
 * Counters with labels list the label sets seen so far, in a fixed order;
 * the unlabelled counters, the gauges and every kind's histogram are
 * always present.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL m or write),
 * HR_ERR_NOMEM, or HR_ERR_CALLBACK_FAILURE.
 */
HR_EXTERN int hr_metrics_render(const hr_metrics *m, hr_metrics_write_fn write,
                                void *user_data);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_METRICS_H */
