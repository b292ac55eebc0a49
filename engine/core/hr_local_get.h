/*
 * GETs answered outside a session: the in-process server
 * (engine/inproc/) hands its provider hr_srv_get handles of its own, and
 * hr_get_answer(), hr_get_fail() and hr_srv_get_info() forward them to
 * these hooks.  A session's own handles have `local` NULL.
 */
#ifndef HR_LOCAL_GET_H
#define HR_LOCAL_GET_H

#include <hurray/session.h>

typedef struct hr__local_get_ops {
  int (*answer)(hr_srv_get *g, hr_tensor *t);
  int (*fail)(hr_srv_get *g, uint32_t wire_error, const char *message);
  const hr_get_info *(*info)(const hr_srv_get *g);
} hr__local_get_ops;

struct hr_stream;

struct hr_srv_get {
  struct hr_stream *st;
  const hr__local_get_ops *local; /* NULL: a session's GET */
  int narrow; /* hr_get_set_narrow(): the reader may not see every key */
};

#endif /* HR_LOCAL_GET_H */
