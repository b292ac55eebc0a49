/*
 * GPUDirect source (docs/protocol.md § 25.1 decision 70): the device
 * memory a device part of a stream would be staged from, described as the
 * RDMA source region the data plane registers, so that the fabric reads
 * the bytes straight from the device.  The session decides here only
 * whether the part's memory has the shape a region needs; whether the
 * fabric reaches it is the registration's answer (hr_rdma_new), and when
 * the bytes may be read is the producer's event (hr_send.c waits for it on
 * the device, asynchronously, before the descriptor goes).
 */
#include <string.h>

#include "hr_session_int.h"

int hr__rdma_src_region(const hr_part *p, hr_descriptor *local, void **bufs,
                        const char **why) {
  const hr_descriptor *d = &p->desc;
  hr_gpu *g = p->dsrc[0] ? hr_gpu_buf_device(p->dsrc[0]) : NULL;
  hr_gpu_caps caps;
  if (p->xmode != HR_XM_STAGE || p->shm || !g || d->buffer_count == 0 ||
      d->buffer_count > HR_MAX_BUFFERS || hr_gpu_query(g, &caps) != 0) {
    *why = "not device memory of one device";
    return HR_ERR_UNSUPPORTED;
  }
  *local = *d;
  for (unsigned k = 0; k < d->buffer_count; k++) {
    hr_gpu_buf *b = p->dsrc[k];
    /* hr__part_device() gives every buffer of a whole tensor, or one
     * range of buffer 0 for a shard; the region is exactly that. */
    if (!b || hr_gpu_buf_device(b) != g ||
        p->len[k] != d->buffers[k].size_bytes) {
      *why = "the device part does not cover its buffers";
      return HR_ERR_UNSUPPORTED;
    }
    uint8_t *base = hr_gpu_buf_device_ptr(b);
    if (!base) {
      *why = "the device has no address the fabric can use";
      return HR_ERR_UNSUPPORTED;
    }
    uint64_t end;
    if (!hr__add_u64(p->doff[k], p->len[k], &end) || end > hr_gpu_buf_size(b)) {
      *why = "the device part lies outside its buffer";
      return HR_ERR_UNSUPPORTED;
    }
    bufs[k] = base + p->doff[k];
    /* The region is device memory of this device: the fabric registers
     * it with the device's interface (FI_HMEM), never as host memory. */
    local->buffers[k].device_tag = caps.device_tag;
    local->buffers[k].device_index = caps.device_index;
  }
  *why = "";
  return 0;
}
