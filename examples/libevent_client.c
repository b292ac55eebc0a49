/*
 * Example 2: the hurray client inside a host's existing libevent loop.
 *
 *   libevent_client hurray://127.0.0.1:7474 KEY...
 *
 * The host already runs an event_base with its own events (here a
 * heartbeat timer standing for the application's other work).  It
 * attaches a hurray engine to that base with hr_ev_attach(); every engine
 * callback then runs on the loop's thread, between the host's own
 * callbacks.  The binding never creates an event_base of its own.
 */
#include <stdio.h>
#include <string.h>

#include <hurray/hr_event.h>

typedef struct app {
  struct event_base *base;
  hr_conn *conn;
  int pending; /* GETs not completed yet */
  int status;
  int heartbeats;
} app;

static void heartbeat(evutil_socket_t fd, short what, void *ud) {
  app *a = ud;

  (void)fd;
  (void)what;
  a->heartbeats++; /* the host's own work goes on beside the engine */
}

static void on_tensor(hr_session *s, uint32_t stream_id, hr_tensor *t,
                      const hr_transfer_record *rec, void *ud) {
  app *a = ud;

  (void)s;
  if (t) {
    const hr_descriptor *d = hr_tensor_descriptor(t);
    printf("stream %u: %s, %u-d, %llu bytes, %s\n", stream_id,
           hr_elem_type_name(d->element_type), d->rank,
           (unsigned long long)hr_tensor_bytes(t),
           hr_layout_name(d->layout.tag));
    hr_tensor_unref(t);
  } else {
    fprintf(stderr, "libevent_client: stream %u failed: %s %s\n", stream_id,
            rec->wire_error ? hr_wire_error_name(rec->wire_error)
                            : hr_strerror(rec->status),
            rec->message);
    a->status = 1;
  }
  if (--a->pending == 0)
    hr_conn_close(a->conn);
}

static void on_conn(hr_conn *c, int status, void *ud) {
  app *a = ud;

  (void)c;
  if (status == 0)
    return; /* established; the GETs queued before are on their way */
  if (status != HR_ERR_CLOSED) {
    const char *msg;
    hr_conn_error(c, NULL, NULL, &msg);
    fprintf(stderr, "libevent_client: %s%s%s\n", hr_strerror(status),
            msg[0] ? ": " : "", msg);
    a->status = 1;
  }
  event_base_loopexit(a->base, NULL);
}

int main(int argc, char **argv) {
  struct timeval ms100 = {0, 100000};
  struct event *hb;
  hr_engine *e;
  app a;
  int i, rv;

  if (argc < 3) {
    fprintf(stderr, "usage: %s hurray://HOST:PORT KEY...\n", argv[0]);
    return 2;
  }
  memset(&a, 0, sizeof a);
  a.base = event_base_new(); /* the host's loop, created by the host */
  hb = event_new(a.base, -1, EV_PERSIST, heartbeat, &a);
  event_add(hb, &ms100);

  rv = hr_ev_attach(&e, a.base, NULL, NULL);
  if (rv == 0)
    rv = hr_engine_connect(e, argv[1], NULL, on_conn, &a, &a.conn);
  if (rv) {
    fprintf(stderr, "libevent_client: %s\n", hr_strerror(rv));
    return 1;
  }
  /* Requests may be queued at once: they leave after the HELLOs, all
   * multiplexed on the one connection. */
  for (i = 2; i < argc; i++) {
    hr_get_opts o;
    memset(&o, 0, sizeof o);
    o.key = (const uint8_t *)argv[i];
    o.key_len = (uint16_t)strlen(argv[i]);
    o.max_shards = 1;
    if (hr_session_get(hr_conn_session(a.conn), &o, on_tensor, &a, NULL) == 0)
      a.pending++;
  }
  if (a.pending == 0)
    hr_conn_close(a.conn);
  event_base_dispatch(a.base);

  rv = hr_engine_del(e);
  event_free(hb);
  event_base_free(a.base);
  return a.status || rv;
}
