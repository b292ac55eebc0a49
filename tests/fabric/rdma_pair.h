/*
 * Pieces the RDMA session tests share (test_rdma_session.c,
 * test_rdma_devsrc.c, test_rdma_devalloc.c): a client and a server
 * endpoint of the fake fabric and the settings that announce them, a
 * server provider answering GETs with one tensor and keeping the last
 * PUT, a client's completion, and a tracker of the work the sessions
 * submit.  How each test drives its sessions (the pump) stays its own.
 * Every helper fails the calling cmocka test when a step it takes fails.
 */
#ifndef HR_TESTS_RDMA_PAIR_H
#define HR_TESTS_RDMA_PAIR_H

#include <pthread.h>
#include <stdint.h>

#include <hurray/gpu.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#include "fabric/hr_fab_fake.h"

/* The room for a HELLO extension carrying a fake fabric address. */
#define RP_EXT_CAP 600

/* A fake fabric with a "client" and a "server" endpoint. */
void rp_fabric_open(hr__fake_world **fw, hr__fake_ep **ec, hr__fake_ep **es);
/* Progresses both endpoints until what they still run ends (the
 * buffers' release; the sessions are gone by then), checks that neither
 * holds a registration, and frees them and the fabric. */
void rp_fabric_close(hr__fake_world *fw, hr__fake_ep *ec, hr__fake_ep *es);

/* Default session settings; with `ep`, its fabric too: the fake ops,
 * `caps`, destination registration `dest` and a HELLO extension (written
 * into `ext`, RP_EXT_CAP bytes, which must outlive the session) with the
 * endpoint's FABRIC_ADDRESS. */
void rp_settings(hr_settings *st, hr__fake_ep *ep, uint8_t *ext, uint32_t caps,
                 int dest);

/* A host UINT8 tensor of `n` bytes, 64-byte aligned, holding a pattern
 * that differs with `seed`. */
hr_tensor *rp_make_tensor(uint64_t n, uint32_t seed);

/* What a server's provider answers GETs with and what the last PUT
 * committed (both owned references, or NULL). */
typedef struct rp_store {
  hr_tensor *served;
  hr_tensor *committed;
} rp_store;

/* A provider (zeroed first) whose GET answers `st->served` and whose PUT
 * is accepted and committed into `st->committed`. */
void rp_provider(hr_provider *prov, rp_store *st);
/* Drops both references. */
void rp_store_free(rp_store *st);

/* A client's completion of a GET or PUT. */
typedef struct rp_result {
  int done; /* callbacks since the request: a second one is a bug */
  int status;
  uint32_t sid;
  hr_tensor *got; /* a GET's tensor (owned; a later GET replaces it) */
  hr_transfer_record rec;
} rp_result;

/* Completion callbacks; `ud` is the rp_result. */
void rp_on_get(hr_session *s, uint32_t sid, hr_tensor *t,
               const hr_transfer_record *rec, void *ud);
void rp_on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
               void *ud);

/* GET options of `key` (everything else zero: host memory). */
void rp_get_opts(hr_get_opts *o, const char *key);
/* Starts a GET of `key` on client session `c` (into device `g` with
 * `sync` when `g` is set) completing into `r`, whose done and status
 * are cleared; *sid (when not NULL) is its stream. */
void rp_get_start(hr_session *c, rp_result *r, const char *key, hr_gpu *g,
                  uint8_t sync, uint32_t *sid);

/* Work the sessions submitted (submit_work), out until reported done on
 * the driving thread; any thread may mark one finished. */
#define RP_MAXW 64
typedef struct rp_work {
  hr_work *w;
  hr_session *s;
  pthread_t th; /* joined when reported, when has_th */
  int has_th;
  int finished;
} rp_work;

typedef struct rp_works {
  pthread_mutex_t mu;
  rp_work e[RP_MAXW];
  int n;
} rp_works;

void rp_works_init(rp_works *k);
void rp_works_fini(rp_works *k);
/* Records work `w` that session `s` submitted (driving thread). */
void rp_works_add(rp_works *k, hr_session *s, hr_work *w);
/* Records `th` as the thread running `w` (driving thread, before the
 * next rp_works_drain()). */
void rp_works_set_thread(rp_works *k, hr_work *w, pthread_t th);
/* Marks `w` finished; `works` is the rp_works (any thread; the shape of
 * hr_work.start's completion). */
void rp_works_finish(hr_work *w, void *works);
/* Reports each finished work to its session at `now` (after joining its
 * thread), adding how many to *reported when not NULL; returns how many
 * are still out.  Driving thread. */
int rp_works_drain(rp_works *k, hr_tstamp now, int *reported);

#endif /* HR_TESTS_RDMA_PAIR_H */
