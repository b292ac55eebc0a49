/*
 * libhurray: tensors in shared memory, for the SHM data plane (wire-v1
 * § 14).
 *
 * A server on a Unix domain socket answers a GET whose client advertised
 * SHM_DATA_PLANE by handing over the file descriptor of the segment that
 * holds the tensor (SCM_RIGHTS) instead of sending its bytes: the client
 * maps it read-only and sends BUFFER_RELEASE when the application drops
 * the tensor.  That works for tensors that know their segment
 * (hr_tensor_set_segment() in <hurray/tensor.h>): the ones made here,
 * files loaded by <hurray/files.h>, and tensors of 1 MiB or more PUT to
 * an engine's server over a Unix socket (their landing buffers are
 * segments).  Other tensors go as frames.
 *
 * Thread safety: no shared state; tensors as in <hurray/tensor.h>.
 */
#ifndef HURRAY_SHM_H
#define HURRAY_SHM_H

#include <hurray/common.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Allocates a tensor whose buffers live in a new memfd (MFD_CLOEXEC |
 * MFD_ALLOW_SEALING, sealed with F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_SEAL), buffer 0 at offset 0 and the others placed as wire-v1
 * § 7.1 says; the tensor's segment is a read-only reopening of it, so no
 * peer can map the bytes writable.  Fill the buffers before the tensor is
 * served; they must not change afterwards.  Contents start zeroed.
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL, a composite, an alignment
 * above 2^21, size overflow), HR_ERR_NOMEM, HR_ERR_IO (memfd_create,
 * sealing, or /proc not mounted).
 */
HR_EXTERN int hr_shm_tensor_alloc(hr_tensor **out, const hr_descriptor *desc,
                                  const hr_mem *mem);

/* Copies a plain tensor into a new segment (hr_shm_tensor_alloc): one copy,
 * once, for a tensor that will be served over SHM often.  Returns as
 * hr_shm_tensor_alloc(); HR_ERR_INVALID_ARGUMENT for a composite. */
HR_EXTERN int hr_shm_tensor_copy(hr_tensor **out, const hr_tensor *t,
                                 const hr_mem *mem);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_SHM_H */
