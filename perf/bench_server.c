/* bench_common.h's server on its own thread: a libevent loop. */
#include "bench_common.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <hurray/hr_event.h>

static void srv_closed(hr_engine *e, void *ud) {
  (void)e;
  event_base_loopbreak(((bc_server *)ud)->base);
}

static void srv_wakeup(hr_engine *e, void *ud) {
  bc_server *s = ud;
  if (atomic_load(&s->stop))
    hr_engine_close(e, srv_closed, s);
}

static void *srv_main(void *arg) {
  bc_server *s = arg;
  hr_provider prov;
  hr_listener *l;
  char url[128];

  s->base = event_base_new();
  s->cfg.on_wakeup = srv_wakeup;
  s->cfg.user_data = s;
  if (hr_ev_attach(&s->e, s->base, &s->cfg, NULL) != 0)
    bc_die("hr_ev_attach");
  hr_store_provider(s->store, &prov);
  if (hr_engine_listen(s->e, "127.0.0.1:0", &prov, &l) != 0)
    bc_die("listen tcp");
  s->port = hr_listener_port(l);
  if (s->unix_path) {
    snprintf(url, sizeof url, "unix:%s", s->unix_path);
    if (hr_engine_listen(s->e, url, &prov, NULL) != 0)
      bc_die("listen unix");
  }
  atomic_store(&s->ready, 1);
  event_base_dispatch(s->base);
  hr_engine_del(s->e);
  event_base_free(s->base);
  return NULL;
}

void bc_server_start(bc_server *s, hr_store *store,
                     const hr_engine_config *cfg, const char *unix_path) {
  memset(s, 0, sizeof *s);
  s->store = store;
  if (cfg)
    s->cfg = *cfg;
  else
    hr_engine_config_default(&s->cfg);
  s->unix_path = unix_path;
  if (pthread_create(&s->th, NULL, srv_main, s) != 0)
    bc_die("pthread_create");
  while (!atomic_load(&s->ready))
    usleep(1000);
}

void bc_server_stop(bc_server *s) {
  atomic_store(&s->stop, 1);
  hr_engine_wakeup(s->e);
  pthread_join(s->th, NULL);
}
