/*
 * libhurray: tensors from and to files (.npy and .safetensors).
 *
 * Loading maps the file read-only and wraps the tensor bytes where they
 * lie (zero copy): the mapping lives as long as any tensor taken from it.
 * Descriptors are dense and on the CPU: a C-order .npy and every
 * safetensors tensor are ROW_MAJOR, a Fortran-order .npy is COLUMN_MAJOR.
 *
 * Element types.  .npy: b1 BOOL, i1/u1/i2/u2/i4/u4/i8/u8, f2 FLOAT16,
 * f4 FLOAT32, f8 FLOAT64, c8 COMPLEX64, c16 COMPLEX128, in either byte
 * order (big-endian data is converted into a private copy).  numpy has no
 * dtype for bfloat16 or the float8 formats, so they are written (and read)
 * as a structured dtype of one field whose name is the type,
 * [('bfloat16', '<u2')], [('float8_e4m3fn', '|u1')], [('float8_e5m2',
 * '|u1')] (numpy loads these; view the field with ml_dtypes).  On reading,
 * the bare names ('bfloat16', ...) and '<V2' (what ml_dtypes bfloat16
 * arrays are saved as) are accepted too.  INT4/UINT4 have no .npy form:
 * the writer widens them to int8/uint8.  safetensors: BOOL, U8, I8, U16,
 * I16, U32, I32, U64, I64, F16, BF16, F32, F64, F8_E4M3 (FLOAT8_E4M3FN),
 * F8_E5M2, C64, C128.
 *
 * Every function that can fail because of a file's contents fills `why`
 * (when non-NULL) with a one-line reason.  Thread-safe: no shared state.
 */
#ifndef HURRAY_FILES_H
#define HURRAY_FILES_H

#include <hurray/common.h>
#include <hurray/tensor.h>
#include <hurray/wire.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* .npy                                                                      */
/* ------------------------------------------------------------------------ */

/* What a .npy header says. */
typedef struct hr_npy_info {
  hr_descriptor desc;   /* ROW_MAJOR or COLUMN_MAJOR, one CPU buffer */
  uint64_t data_offset; /* where the array's bytes start in the file */
  int big_endian;       /* the data is big-endian (needs a swap) */
  uint8_t major, minor; /* format version (1.0, 2.0 or 3.0) */
} hr_npy_info;

/*
 * Parses the header of a .npy held in memory (`len` bytes from the file's
 * start; the data need not follow).  Checks that the array's bytes fit in
 * `file_size` (pass UINT64_MAX to skip that check).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (not a .npy, malformed header, rank > 32, size
 * overflow, truncated), HR_ERR_UNSUPPORTED (a dtype with no wire element
 * type: object, strings, structured arrays, 1-byte voids).
 */
HR_EXTERN int hr_npy_parse(const void *data, size_t len, uint64_t file_size,
                           hr_npy_info *out, char *why, size_t why_len);

/* Loads a .npy: maps it and wraps the array (a private, byte-swapped copy
 * for big-endian data).  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL out or
 * path), hr_npy_parse()'s errors, HR_ERR_IO (open/map), HR_ERR_NOMEM. */
HR_EXTERN int hr_npy_load(hr_tensor **out, const char *path, const hr_mem *mem,
                          char *why, size_t why_len);

/*
 * Writes a dense tensor's bytes as a .npy (format 1.0, or 2.0 when the
 * header needs it; data 64-byte aligned): ROW_MAJOR as C order,
 * COLUMN_MAJOR as Fortran order.  `data` holds the descriptor's buffer 0.
 * Returns 0, HR_ERR_UNSUPPORTED (another layout; a composite),
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_IO.
 */
HR_EXTERN int hr_npy_save(const char *path, const hr_descriptor *d,
                          const void *data, char *why, size_t why_len);

/* The .npy header (magic to the final newline) for `d`: returns its
 * length, or HR_ERR_BUFFER_TOO_SMALL / HR_ERR_UNSUPPORTED. */
HR_EXTERN int64_t hr_npy_header(const hr_descriptor *d, char *out, size_t cap);

/* The numpy dtype string for an element type ("<f4", "|b1", ...), NULL
 * for the types written as a structured dtype or widened. */
HR_EXTERN const char *hr_npy_dtype(uint8_t element_type);

/* ------------------------------------------------------------------------ */
/* .safetensors                                                              */
/* ------------------------------------------------------------------------ */

typedef struct hr_safetensors hr_safetensors;

/*
 * Maps a .safetensors file and parses its JSON header (at most 100 MB):
 * every tensor's dtype, shape and data_offsets are checked (inside the
 * data section, exact size, no overlap).  Tensors are listed in ascending
 * name order.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL out or path, a
 * malformed file), HR_ERR_UNSUPPORTED (a dtype with no wire element type),
 * HR_ERR_IO, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_safetensors_open(hr_safetensors **out, const char *path,
                                  const hr_mem *mem, char *why, size_t why_len);

/* Number of tensors; the name of tensor i (UTF-8, NUL-terminated; NULL
 * when out of range). */
HR_EXTERN size_t hr_safetensors_count(const hr_safetensors *f);
HR_EXTERN const char *hr_safetensors_name(const hr_safetensors *f, size_t i);

/* Wraps tensor i in place (zero copy; the tensor keeps the file mapped).
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL f or out), HR_ERR_NOT_FOUND
 * (i out of range), HR_ERR_NOMEM. */
HR_EXTERN int hr_safetensors_tensor(hr_safetensors *f, size_t i,
                                    hr_tensor **out);

/* Closes the file object; tensors taken from it stay valid.  NULL is a
 * no-op. */
HR_EXTERN void hr_safetensors_close(hr_safetensors *f);

/* safetensors dtype names: element type -> "F32" (NULL if none), and back
 * (HR_ELEM_NONE if unknown). */
HR_EXTERN const char *hr_safetensors_dtype_name(uint8_t element_type);
HR_EXTERN uint8_t hr_safetensors_dtype_parse(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_FILES_H */
