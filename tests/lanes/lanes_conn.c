/* A client connection over lanes: see lanes_conn.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lanes/lanes_conn.h"

void cconn_on_conn(hr_conn *c, int status, void *ud) {
  cconn *cc = ud;
  (void)c;
  if (status == 0 && !cc->up) {
    cc->up = 1;
    return;
  }
  cc->closed = 1;
  cc->status = status;
}

int cconn_settled(void *ud) {
  cconn *cc = ud;
  return cc->up || cc->closed;
}

void cconn_open(tl_env *env, hr_engine *e, const char *url, unsigned lanes,
                cconn *cc) {
  memset(cc, 0, sizeof *cc);
  assert_int_equal(
      hr_engine_connect_group(e, url, lanes, NULL, cconn_on_conn, cc, &cc->c),
      0);
  assert_true(tl_run(env, cconn_settled, cc, TL_WAIT_MS));
  assert_true(cc->up);
  assert_int_equal(hr_conn_lanes(cc->c), lanes);
}

int cconn_closed(void *cc) {
  return ((cconn *)cc)->closed;
}

void cconn_close(tl_env *env, cconn *cc) {
  hr_conn_close(cc->c);
  assert_true(tl_run(env, cconn_closed, cc, TL_WAIT_MS));
}
