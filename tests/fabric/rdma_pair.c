/* Pieces the RDMA session tests share: see rdma_pair.h. */
#include "rdma_pair.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hurray/fabric.h>

#include "common/test_util.h"

void rp_fabric_open(hr__fake_world **fw, hr__fake_ep **ec, hr__fake_ep **es) {
  assert_int_equal(hr__fake_world_new(fw, NULL), 0);
  assert_int_equal(hr__fake_ep_new(ec, *fw, "client", 1, 0), 0);
  assert_int_equal(hr__fake_ep_new(es, *fw, "server", 1, 0), 0);
}

void rp_fabric_close(hr__fake_world *fw, hr__fake_ep *ec, hr__fake_ep *es) {
  for (int i = 0; i < 100; i++) {
    hr__fake_progress(ec);
    hr__fake_progress(es);
  }
  hr__fake_stats st;
  hr__fake_get_stats(ec, &st);
  assert_int_equal(st.live_regs, 0);
  hr__fake_get_stats(es, &st);
  assert_int_equal(st.live_regs, 0);
  hr__fake_ep_del(ec);
  hr__fake_ep_del(es);
  hr__fake_world_del(fw);
}

void rp_settings(hr_settings *st, hr__fake_ep *ep, uint8_t *ext, uint32_t caps,
                 int dest) {
  hr_settings_default(st);
  if (!ep)
    return;
  uint8_t addr[400];
  int64_t n = hr__fake_address(ep, addr, sizeof addr);
  assert_true(n > 0);
  int e = hr_ext_put(ext, RP_EXT_CAP, HR_EXT_FABRIC_ADDRESS, addr, (uint16_t)n);
  assert_true(e > 0);
  st->fabric_ops = hr__fake_ops();
  st->fabric_ctx = ep;
  st->fabric_caps = caps;
  st->hello_ext = ext;
  st->hello_ext_len = (uint16_t)e;
  st->hello_ext_count = 1;
  st->rdma_destination = dest;
}

hr_tensor *rp_make_tensor(uint64_t n, uint32_t seed) {
  hr_descriptor d = tu_bytes_desc(n, 0, HR_DEV_CPU);
  hr_tensor *t = NULL;
  assert_int_equal(hr_tensor_alloc(&t, &d, 6, NULL), 0);
  uint8_t *p = hr_tensor_buffer(t, 0);
  for (uint64_t i = 0; i < n; i++)
    p[i] = (uint8_t)((i * 2654435761u) >> 13 ^ seed);
  return t;
}

static int p_get(hr_session *s, hr_srv_get *g, void *ud) {
  rp_store *st = ud;
  (void)s;
  return hr_get_answer(g, st->served);
}

static int p_put_begin(hr_session *s, const hr_put_info *i, uint32_t *wire,
                       void *ud) {
  (void)s;
  (void)i;
  (void)wire;
  (void)ud;
  return 0;
}

static int p_put_commit(hr_session *s, const hr_put_info *i, hr_tensor *t,
                        uint32_t *wire, void *ud) {
  rp_store *st = ud;
  (void)s;
  (void)i;
  (void)wire;
  hr_tensor_unref(st->committed);
  st->committed = hr_tensor_ref(t);
  return 0;
}

void rp_provider(hr_provider *prov, rp_store *st) {
  memset(prov, 0, sizeof *prov);
  prov->size = sizeof *prov;
  prov->user_data = st;
  prov->on_get = p_get;
  prov->on_put_begin = p_put_begin;
  prov->on_put_commit = p_put_commit;
}

void rp_store_free(rp_store *st) {
  hr_tensor_unref(st->served);
  hr_tensor_unref(st->committed);
  st->served = st->committed = NULL;
}

void rp_on_get(hr_session *s, uint32_t sid, hr_tensor *t,
               const hr_transfer_record *rec, void *ud) {
  rp_result *r = ud;
  (void)s;
  r->done++;
  r->sid = sid;
  hr_tensor_unref(r->got);
  r->got = t;
  r->rec = *rec;
  r->status = rec->status;
}

void rp_on_put(hr_session *s, uint32_t sid, const hr_transfer_record *rec,
               void *ud) {
  rp_result *r = ud;
  (void)s;
  r->done++;
  r->sid = sid;
  r->rec = *rec;
  r->status = rec->status;
}

void rp_get_opts(hr_get_opts *o, const char *key) {
  memset(o, 0, sizeof *o);
  o->key = (const uint8_t *)key;
  o->key_len = (uint16_t)strlen(key);
}

void rp_get_start(hr_session *c, rp_result *r, const char *key, hr_gpu *g,
                  uint8_t sync, uint32_t *sid) {
  hr_get_opts o;
  rp_get_opts(&o, key);
  o.device = g;
  o.device_sync = sync;
  r->done = 0;
  r->status = 0;
  assert_int_equal(hr_session_get(c, &o, rp_on_get, r, sid), 0);
}

void rp_works_init(rp_works *k) {
  memset(k, 0, sizeof *k);
  pthread_mutex_init(&k->mu, NULL);
}

void rp_works_fini(rp_works *k) {
  pthread_mutex_destroy(&k->mu);
}

void rp_works_add(rp_works *k, hr_session *s, hr_work *w) {
  pthread_mutex_lock(&k->mu);
  assert_true(k->n < RP_MAXW);
  int i = k->n++;
  k->e[i].w = w;
  k->e[i].s = s;
  k->e[i].has_th = 0;
  k->e[i].finished = 0;
  pthread_mutex_unlock(&k->mu);
}

void rp_works_set_thread(rp_works *k, hr_work *w, pthread_t th) {
  pthread_mutex_lock(&k->mu);
  for (int i = 0; i < k->n; i++)
    if (k->e[i].w == w) {
      k->e[i].th = th;
      k->e[i].has_th = 1;
    }
  pthread_mutex_unlock(&k->mu);
}

void rp_works_finish(hr_work *w, void *works) {
  rp_works *k = works;
  pthread_mutex_lock(&k->mu);
  for (int i = 0; i < k->n; i++)
    if (k->e[i].w == w)
      k->e[i].finished = 1;
  pthread_mutex_unlock(&k->mu);
}

int rp_works_drain(rp_works *k, hr_tstamp now, int *reported) {
  for (;;) {
    int found = 0;
    rp_work x;
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < k->n; i++)
      if (k->e[i].finished) {
        x = k->e[i];
        k->e[i] = k->e[--k->n];
        found = 1;
        break;
      }
    int left = k->n;
    pthread_mutex_unlock(&k->mu);
    if (!found)
      return left;
    if (x.has_th)
      pthread_join(x.th, NULL);
    hr_session_work_done(x.s, x.w, now);
    if (reported)
      ++*reported;
  }
}
