/*
 * Client helpers of the engine tests: an asynchronous connection on an
 * engine of a tl_env, and request helpers that run the loop until their
 * completion arrived.
 */
#ifndef HR_TC_H
#define HR_TC_H

#include <string.h>

#include "tl.h"

typedef struct tc_conn {
  tl_env *env;
  hr_engine *e;
  hr_conn *c;
  int up;
  int closed;
  int status; /* first callback's status when it failed, else the close */
  uint32_t wire_error;
  int wire_sent;
  char message[256];
} tc_conn;

typedef struct tc_res {
  int done;
  hr_tensor *t;
  hr_transfer_record rec;
  int status;
  /* LIST */
  uint32_t wire_error;
  int more;
  size_t nentries;
  char keys[64][64];
  hr_list_entry entries[64];
  /* PING */
  uint64_t rtt;
} tc_res;

/* Starts a connection (does not wait). */
void tc_connect(tl_env *env, hr_engine *e, const char *url, tc_conn *c,
                const hr_settings *settings);
/* Waits until it is up or failed; returns 1 when up. */
int tc_wait_up(tc_conn *c, int timeout_ms);
/* Connects and asserts it came up. */
void tc_open(tl_env *env, hr_engine *e, const char *url, tc_conn *c);
/* Closes gracefully and waits for the close callback. */
void tc_close(tc_conn *c);
/* Waits for the close callback (the peer ends it). */
int tc_wait_closed(tc_conn *c, int timeout_ms);

/* Queues a GET (the result lands in *r), flushes the engine. */
int tc_get_start(tc_conn *c, const hr_get_opts *o, tc_res *r, uint32_t *sid);
/* Runs until r->done. */
int tc_wait(tc_conn *c, tc_res *r, int timeout_ms);
/* GET and wait; returns the status (0: r->t holds the tensor). */
int tc_get(tc_conn *c, const hr_get_opts *o, tc_res *r);
/* A GET of `key` with no preferences. */
int tc_get_key(tc_conn *c, const char *key, tc_res *r);
int tc_put(tc_conn *c, const char *key, uint32_t flags, hr_tensor *t,
           tc_res *r);
/* Queues a PUT and flushes (does not wait). */
int tc_put_start(tc_conn *c, const char *key, uint32_t flags, hr_tensor *t,
                 tc_res *r);
int tc_list(tc_conn *c, const char *prefix, const char *start_after,
            uint16_t max, tc_res *r);
int tc_ping(tc_conn *c, tc_res *r);
/* Drops r->t. */
void tc_res_clear(tc_res *r);

static inline void tc_opts(hr_get_opts *o, const char *key) {
  memset(o, 0, sizeof *o);
  o->key = (const uint8_t *)key;
  o->key_len = (uint16_t)strlen(key);
  o->max_shards = 1;
}

#endif /* HR_TC_H */
