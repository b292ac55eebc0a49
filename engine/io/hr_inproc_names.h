/*
 * The names of "inproc:NAME" listeners (hr_engine_listen() /
 * hr_engine_connect() with hr_engine_config.inproc_hub).
 *
 * An in-process connection is a full Hurray session over an AF_UNIX
 * socketpair: nothing is named in the file system or the abstract socket
 * namespace, so no other process can reach it.  A listener owns a
 * hand-over pair (SOCK_SEQPACKET): it watches the receiving end as it
 * would watch a listening socket, and the table keeps the sending end
 * under its name.  A connect makes the connection's socketpair, keeps
 * one end and sends the other over the listener's hand-over socket
 * (SCM_RIGHTS), all under the table's lock, so a listener that closes
 * meanwhile is never written to.  The listener "accepts" by receiving
 * the descriptor; connections handed over but not received when the
 * listener closes are closed by the kernel, and their clients see the
 * close.
 *
 * The table is the first member of struct hr_inproc_hub (engine/inproc/),
 * the application's object that engines share through their config; the
 * hub's own in-process servers (hr_inproc_listen()) claim their names
 * here too (descriptor -1), so one hub has one namespace.  Any thread.
 */
#ifndef HR_INPROC_NAMES_H
#define HR_INPROC_NAMES_H

#include <pthread.h>
#include <stddef.h>

#include <hurray/common.h>

/* A name: 1 to HR__INPROC_NAME_MAX bytes, no NUL. */
#define HR__INPROC_NAME_MAX 255

typedef struct hr__inproc_name hr__inproc_name;

typedef struct hr__inproc_names {
  pthread_mutex_t mu;
  hr_mem mem;
  hr__inproc_name *head;
  size_t count;
} hr__inproc_names;

/* Returns 0 or HR_ERR_IO (the mutex). */
int hr__inproc_names_init(hr__inproc_names *n, const hr_mem *mem);
/* Frees the table (it must be empty: hr__inproc_names_count()). */
void hr__inproc_names_fini(hr__inproc_names *n);
size_t hr__inproc_names_count(hr__inproc_names *n);

/* Claims `name` for a listener whose hand-over socket's sending end is
 * `fd` (the table owns it from now on, also on failure), or for a hub
 * server (fd -1).  Returns 0, HR_ERR_BUSY (taken), HR_ERR_INVALID_ARGUMENT
 * (a bad name), HR_ERR_NOMEM. */
int hr__inproc_names_bind(hr__inproc_names *n, const char *name, int fd);
/* Frees `name` (closing its descriptor).  A name not there: nothing. */
void hr__inproc_names_unbind(hr__inproc_names *n, const char *name);

/* Makes a hand-over pair: *rx for the listener (non-blocking), *tx for
 * hr__inproc_names_bind().  Returns 0 or HR_ERR_IO. */
int hr__inproc_handover_pair(int *rx, int *tx);
/* Listener: takes one connection handed over on `rx`.  Returns its
 * descriptor (non-blocking, close-on-exec), HR_ERR_WOULDBLOCK (none
 * waits) or HR_ERR_IO. */
int hr__inproc_accept(int rx);

/* Connects to the listener called `name`: returns the client's end of a
 * fresh socketpair (non-blocking, close-on-exec; connected), or
 * HR_ERR_NOT_FOUND (no such name), HR_ERR_UNSUPPORTED (the name is a hub
 * server: hr_inproc_connect() reaches it), HR_ERR_WOULDBLOCK (the
 * listener has too many connections waiting to be accepted), HR_ERR_IO.
 * `why` (may be NULL) says why. */
int hr__inproc_connect(hr__inproc_names *n, const char *name, char *why,
                       size_t why_len);

#endif /* HR_INPROC_NAMES_H */
