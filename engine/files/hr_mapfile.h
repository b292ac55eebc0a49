/*
 * A read-only file mapping shared by the tensors wrapped from it.  The
 * count is atomic because tensors may die on any thread; the last
 * reference unmaps.
 */
#ifndef HR_MAPFILE_H
#define HR_MAPFILE_H

#include <stddef.h>
#include <stdint.h>

#include <hurray/common.h>
#include <hurray/tensor.h>

typedef struct hr__mapfile hr__mapfile;

/* Maps `path` read-only.  Returns 0, HR_ERR_IO (open/stat/mmap; `why`
 * filled), HR_ERR_NOMEM. */
int hr__mapfile_open(hr__mapfile **out, const char *path, const hr_mem *mem,
                     char *why, size_t why_len);
const uint8_t *hr__mapfile_data(const hr__mapfile *m);
uint64_t hr__mapfile_size(const hr__mapfile *m);
void hr__mapfile_ref(hr__mapfile *m);
void hr__mapfile_unref(hr__mapfile *m);

/* Wraps `data` (inside the mapping) as a tensor of descriptor `d`; the
 * tensor holds a reference to the mapping.  Returns hr_tensor_wrap()'s
 * result. */
int hr__mapfile_wrap(hr__mapfile *m, const hr_descriptor *d,
                     const uint8_t *data, hr_tensor **out);

/* Formats into `why` when non-NULL. */
void hr__files_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills a dense single-buffer CPU descriptor: `layout` ROW_MAJOR or
 * COLUMN_MAJOR, the buffer's alignment from where its data lies.  Returns
 * 0, or HR_ERR_INVALID_ARGUMENT on overflow (size_bytes set). */
int hr__files_dense_desc(hr_descriptor *d, uint8_t elem, uint8_t layout,
                         unsigned rank, const uint64_t *shape,
                         uint64_t *size_bytes);

#endif /* HR_MAPFILE_H */
