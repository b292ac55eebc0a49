/*
 * A client connection over lanes on a test loop (engine_io/tl.h), shared
 * by the loopback and bulk tests.
 */
#ifndef HR_LANES_CONN_H
#define HR_LANES_CONN_H

#include <hurray/engine.h>

#include "engine_io/tl.h"

/* `up` once the group is connected; `closed` and `status` when it went. */
typedef struct cconn {
  hr_conn *c;
  int up, closed, status;
} cconn;

/* hr_engine_connect*()'s callback for a cconn (ud), and the tl_run()
 * condition that it is up or gone: for a test that connects and waits
 * its own way. */
void cconn_on_conn(hr_conn *c, int status, void *ud);
int cconn_settled(void *cc);
/* Connects a group of `lanes` lanes to `url` from engine `e` into `cc`
 * (cleared first) and waits until it is up; fails the test otherwise. */
void cconn_open(tl_env *env, hr_engine *e, const char *url, unsigned lanes,
                cconn *cc);
/* A tl_run() condition: the connection has gone. */
int cconn_closed(void *cc);
/* Closes the connection and waits until it has gone. */
void cconn_close(tl_env *env, cconn *cc);

#endif /* HR_LANES_CONN_H */
