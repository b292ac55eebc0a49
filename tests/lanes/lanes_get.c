/* A GET on a lanes session: see lanes_get.h. */
#include "lanes_get.h"

#include <string.h>

static void on_got(hr_session *s, uint32_t sid, hr_tensor *t,
                   const hr_transfer_record *rec, void *ud) {
  got *g = ud;
  (void)s;
  (void)sid;
  g->done = 1;
  g->t = t;
  g->rec = *rec;
}

int lanes_get_start(hr_engine *e, hr_conn *c, const char *key, uint16_t k,
                    const uint64_t *off, const uint64_t *shape, unsigned rank,
                    got *g) {
  hr_get_opts o;
  int rv;

  memset(&o, 0, sizeof o);
  o.key = (const uint8_t *)key;
  o.key_len = (uint16_t)strlen(key);
  if (k) {
    o.flags |= HR_REQ_PARALLEL_OK;
    o.max_shards = k;
  }
  if (off) {
    o.flags |= HR_REQ_REGION;
    o.region_rank = (uint8_t)rank;
    o.region_offset = off;
    o.region_shape = shape;
  }
  memset(g, 0, sizeof *g);
  rv = hr_session_get(hr_conn_session(c), &o, on_got, g, NULL);
  return rv ? rv : hr_engine_flush(e);
}
