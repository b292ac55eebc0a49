/*
 * The description of a tensor handed over in process (hr_inproc_int.h),
 * shared by the channel and the in-process server/client pair.
 */
#include <string.h>

#include "hr_inproc_int.h"

/* The first leaf buffer of `t` in *first (NULL while none was seen); 0,
 * or HR_ERR_PROTO when a buffer disagrees with it. */
static int walk(hr_tensor *t, const hr_buffer_handle **first, void **ptr) {
  const hr_descriptor *d = hr_tensor_descriptor(t);
  size_t n = hr_tensor_member_count(t);

  if (d->layout.tag == HR_LAYOUT_COMPOSITE || n) {
    for (size_t i = 0; i < n; i++)
      if (walk(hr_tensor_member(t, i), first, ptr))
        return HR_ERR_PROTO;
    return 0;
  }
  for (unsigned k = 0; k < d->buffer_count; k++) {
    if (!*first) {
      *first = &d->buffers[k];
      *ptr = hr_tensor_buffer(t, k);
    } else if (d->buffers[k].sync_mode != (*first)->sync_mode ||
               d->buffers[k].device_tag != (*first)->device_tag) {
      return HR_ERR_PROTO;
    }
  }
  return 0;
}

int hr__inproc_describe(hr_tensor *t, const hr_handoff_payload *sync,
                        hr_buffer_handle *b, hr_handoff_payload *p,
                        hr_wire_status *st) {
  const hr_buffer_handle *first = NULL;
  void *ptr = NULL;

  if (walk(t, &first, &ptr)) {
    if (st) {
      st->code = HR_WIRE_INVALID_SYNC_MODE;
      st->offset = 13;
      st->reason = "in-process: the buffers of one tensor disagree on "
                   "sync_mode or device_tag";
    }
    return HR_ERR_PROTO;
  }
  if (first)
    *b = *first;
  else
    memset(b, 0, sizeof *b); /* no buffer at all: CPU, P1 */
  memset(p, 0, sizeof *p);
  if (sync)
    *p = *sync;
  p->ptr = ptr;
  p->release = NULL;
  p->release_ctx = NULL;
  return 0;
}
