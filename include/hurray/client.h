/*
 * libhurray: the blocking convenience client.
 *
 * hr_client is one connection with calls that return when their request
 * completed: connect, get, put, list, ping, close.  Inside, each call runs
 * a private poll()-based event loop (an hr_loop_ops) driving an ordinary
 * hr_engine on the calling thread until its answer arrived — there is no
 * hidden thread; nothing happens between calls (keepalive PINGs included),
 * and a server's GOAWAY or ERROR is noticed at the next call.  (The
 * engine's one worker thread, started on first use, runs only jobs a call
 * waits for, such as a host name's lookup in hr_client_connect(), made as
 * hr_engine_connect() makes it.)
 *
 * Thread safety: one hr_client belongs to one thread at a time.  Several
 * clients may run in parallel on different threads.
 */
#ifndef HURRAY_CLIENT_H
#define HURRAY_CLIENT_H

#include <hurray/common.h>
#include <hurray/engine.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_client hr_client;

#define HR_CLIENT_OPTIONS_VERSION 1

typedef struct hr_client_options {
  int version;          /* HR_CLIENT_OPTIONS_VERSION */
  hr_settings settings; /* the session's settings (hr_settings_default) */
  int64_t timeout_ms;   /* per call: connect, and each request (30000;
                           -1: none); a request that runs out is cancelled
                           and reports HR_ERR_TIMEOUT */
  /* Progress of long calls: called from inside get/put about every
   * progress_interval_ms with the bytes received and sent on the socket
   * so far (NULL: none). */
  void (*on_progress)(uint64_t rx_bytes, uint64_t tx_bytes, void *user_data);
  int progress_interval_ms; /* 100 */
  /* Taps on the raw byte stream, from the first byte (NULL: none). */
  hr_tap_fn on_rx;
  hr_tap_fn on_tx;
  void *user_data; /* for on_progress, on_rx, on_tx */
  /* ---- appended in 0.1 (0: the default) ---- */
  unsigned lanes; /* connections of the session (1; at most HR_MAX_LANES):
                     with more, a parallel GET's shards come over all of
                     them (hr_engine_connect_group()); taps see lane 0 */
  /* ---- appended for TLS ---- */
  /* For "hurrays://" URLs: the CA file, server name and client certificate
   * (<hurray/engine.h> hr_tls_config; NULL: the system's trust store, no
   * client certificate).  Read by hr_client_connect() only. */
  const struct hr_tls_config *tls;
  /* The RDMA data plane (hr_engine_config): a libfabric provider name or
   * "auto" (NULL: frames only), its local address, and the capability
   * flags to advertise (0: what the fabric justifies).  Read during
   * hr_client_connect() only.  Connecting fails with the fabric's error
   * (HR_ERR_UNSUPPORTED: no such provider) when it cannot be opened. */
  const char *fabric_provider;
  const char *fabric_node;
  uint32_t fabric_caps;
  /* ---- appended for the SHM mapping cache ---- */
  int shm_map_cache; /* hr_engine_config.shm_map_cache: idle segment
                        mappings kept (0: 16; -1: none) */
  /* ---- appended: bulk I/O (0: the default) ---- */
  /* hr_engine_config.bulk_offload_min of the client's engine: reads and
   * writes of tensor bytes of at least this size run on the client's
   * worker threads (one per lane, up to the CPU count), so that lanes use
   * as many cores
   * (0: 1 MiB; UINT64_MAX: never, every byte on the caller's thread). */
  uint64_t bulk_offload_min;
  int bulk_offload_lone; /* hr_engine_config.bulk_offload_lone (0: a
                            single-lane client moves bytes itself) */
  int bulk_offload_jobs; /* hr_engine_config.bulk_offload_jobs (0:
                            automatic, sized to the CPUs; negative:
                            connecting fails, HR_ERR_INVALID_ARGUMENT) */
} hr_client_options;

/* Why a call failed. */
typedef struct hr_client_error {
  int status;          /* the library error the call returned */
  uint32_t wire_error; /* the spec's code sent or received (0: none) */
  int wire_error_sent; /* 1: we sent it (the peer broke a rule) */
  char message[256];   /* the server's text or a local reason ("" if
                          none) */
} hr_client_error;

/* Fills `o` with the defaults documented above. */
HR_EXTERN void hr_client_options_default(hr_client_options *o);

/*
 * Connects to `url` ("hurray://HOST:PORT", "HOST:PORT", "hurrays://HOST:PORT"
 * for TLS, or "unix:PATH") and waits for the HELLO exchange (after the TLS
 * handshake).  `opts` may be NULL (defaults); it is copied.
 * `err` (may be NULL) says why it failed.  On success *out receives the
 * client, owned by the caller until hr_client_close(); on failure *out is
 * not written.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL out or url, an
 * unknown opts->version, a bad URL, a TLS configuration that does not
 * load: the message says why), HR_ERR_IO (refused, unreachable, the TLS
 * handshake failed: the message says what failed, e.g. "certificate
 * verify failed"), HR_ERR_REMOTE (the server answered ERROR, e.g.
 * RESOURCE_EXHAUSTED at its connection cap), HR_ERR_PROTO (the server
 * broke a rule), HR_ERR_TIMEOUT, HR_ERR_CLOSED, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_client_connect(hr_client **out, const char *url,
                                const hr_client_options *opts,
                                const hr_mem *mem, hr_client_error *err);

/*
 * GETs a tensor.  `opts` as for hr_session_get() (its `dest` may name the
 * application's buffer).  On success *out receives the tensor (a
 * reference the caller owns).  `rec` (may be NULL) receives the transfer
 * record, also on failure.  Returns 0, HR_ERR_REMOTE (the server refused:
 * rec->wire_error, e.g. NOT_FOUND), HR_ERR_PROTO (the server broke a
 * rule), HR_ERR_TIMEOUT, HR_ERR_CLOSED (the connection is gone),
 * HR_ERR_STATE (GOAWAY received), HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 * Over "unix:PATH" without `dest` the tensor may be a read-only mapping
 * of the server's shared segment (rec->data_plane HR_PLANE_SHM): never
 * write it.  The server keeps the segment until the tensor is dropped;
 * the BUFFER_RELEASE that tells it goes out on this client's next call
 * (or its close).  A segment this client cannot map fails the GET with
 * HR_ERR_PROTO, rec->wire_error DEVICE_UNAVAILABLE and rec->fallback
 * "shm: ..."; the same GET again is answered with frames.
 */
HR_EXTERN int hr_client_get(hr_client *c, const hr_get_opts *opts,
                            hr_tensor **out, hr_transfer_record *rec);

/*
 * Tensor-parallel loading: fetches the slice of tensor `key` that rank
 * `index` of `count` holds when the tensor is cut along dimension `dim`
 * into `count` slices whose extents differ by at most one
 * (hr_region_slice()).  The shape comes from a LIST of the key, so the
 * server must offer LIST and REGION_REQUESTS (else HR_ERR_UNSUPPORTED);
 * the slice is then a REGION request.  `opts` (may be NULL) supplies the
 * rest of the request: layouts, device, PARALLEL_OK and max_shards, the
 * destination; its key and region fields are ignored.  The result is a
 * shard of the stored tensor (HAS_SHARD, parent_shape, shard_offset).
 * Returns like hr_client_get(), plus HR_ERR_NOT_FOUND (no such key) and
 * HR_ERR_INVALID_ARGUMENT (dim beyond the tensor's rank, count 0, index
 * >= count).
 */
HR_EXTERN int hr_client_get_slice(hr_client *c, const uint8_t *key,
                                  uint16_t key_len, unsigned dim,
                                  uint32_t index, uint32_t count,
                                  const hr_get_opts *opts, hr_tensor **out,
                                  hr_transfer_record *rec);

/* PUTs `t` under `key` (HR_PUT_REPLACE in flags).  A device tensor is
 * sent from device memory as hr_session_put() describes (staged after its
 * event, or GPUDirect); on a timeout or failure the call returns only
 * after its staging copies finished.  Returns like hr_client_get()
 * (refusals: ALREADY_EXISTS, PUT_REJECTED, ...; a staging failure:
 * HR_ERR_NOMEM or HR_ERR_IO; a descriptor naming a device over host
 * memory: HR_ERR_UNSUPPORTED). */
HR_EXTERN int hr_client_put(hr_client *c, const uint8_t *key, uint16_t key_len,
                            uint32_t flags, hr_tensor *t,
                            hr_transfer_record *rec);

/*
 * Lists one page of keys (ascending): `on_entry` runs for each entry of the
 * answer (valid during the call; return non-zero to stop early).  *more
 * (may be NULL) is set when the server has more after this page: ask
 * again with start_after = the last key.  *wire_error (may be NULL)
 * receives a refusal's code.  `on_entry` runs on the calling thread
 * inside this call and must not call this client.  Returns like
 * hr_client_get().
 */
HR_EXTERN int hr_client_list(hr_client *c, const uint8_t *prefix,
                             uint16_t prefix_len, const uint8_t *start_after,
                             uint16_t start_after_len, uint16_t max_entries,
                             int (*on_entry)(const hr_list_entry *e,
                                             void *user_data),
                             void *user_data, int *more, uint32_t *wire_error);

/* Round trip of a PING in ns.  Returns like hr_client_get(). */
HR_EXTERN int hr_client_ping(hr_client *c, uint64_t *rtt_ns);

/*
 * Runs the client's loop until `done(user_data)` returns non-zero, the
 * connection closes or `timeout_ms` passes (-1: no limit): for requests
 * queued directly on hr_client_session() (pipelining).  `done` runs on
 * the calling thread, between turns of the loop, and must not call this
 * client.  Returns 0, HR_ERR_TIMEOUT, HR_ERR_CLOSED (gone before done()
 * said so), HR_ERR_INVALID_ARGUMENT (NULL c or done).
 */
HR_EXTERN int hr_client_wait(hr_client *c, int (*done)(void *user_data),
                             void *user_data, int64_t timeout_ms);

/* The connection's session (valid until hr_client_close()); requests
 * queued on it directly complete inside hr_client_wait() or any later
 * call. */
HR_EXTERN hr_session *hr_client_session(hr_client *c);

/* Open connections of the client's session (its lanes; 1 without
 * hr_client_options.lanes), 0 once it closed. */
HR_EXTERN unsigned hr_client_lanes(const hr_client *c);

/* The server's HELLO (valid until hr_client_close()). */
HR_EXTERN const hr_hello *hr_client_server_hello(const hr_client *c);

/* The TLS state of the connection (lane 0), as hr_conn_tls_info().
 * Returns 0, HR_ERR_UNSUPPORTED (not TLS), HR_ERR_CLOSED,
 * HR_ERR_INVALID_ARGUMENT. */
HR_EXTERN int hr_client_tls_info(const hr_client *c, hr_tls_info *out);

/* Why the last call failed (status 0 after a success). */
HR_EXTERN const hr_client_error *hr_client_last_error(const hr_client *c);

/* Closes gracefully (GOAWAY; waits at most the call timeout) and frees
 * the client.  NULL is a no-op. */
HR_EXTERN void hr_client_close(hr_client *c);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_CLIENT_H */
