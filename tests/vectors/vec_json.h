/*
 * hr_msg -> the vectors' `decoded` JSON shape, and a semantic comparison of
 * two JSON values with a readable diff.
 */
#ifndef VEC_JSON_H
#define VEC_JSON_H

#include "vec_common.h"

/* Converts a decoded message to the vectors' JSON shape (README.md of the
 * vectors): enum fields as numbers, binary fields as hex, integers of 2^53
 * or more as decimal strings, layout_params parsed per layout, `profile` on
 * registered profile entries, extension `value` for known extensions sent
 * in their own direction.  Never NULL (aborts on allocation failure). */
cJSON *vec_msg_to_json(const hr_msg *m);

/* Checks the parsed known HELLO extensions (hr_hello_exts) that the JSON
 * shape does not show (AUTH_TOKEN, SESSION_JOIN, SESSION_TOKEN point at the
 * first entry of their type sent in its own direction; absent ones are
 * NULL).  Returns 0, or -1 with the reason appended to `diag`. */
int vec_check_hello_exts(const hr_msg *m, vec_buf *diag);

/* Compares `want` and `got` semantically (objects as key sets, arrays in
 * order, numbers by value, strings by bytes).  Returns the number of
 * differences; each is appended to `diag` as "path: expected X, got Y"
 * (at most a dozen are written). */
int vec_json_diff(const cJSON *want, const cJSON *got, const char *path,
                  vec_buf *diag);

/* Both compacted, for "expected/got" dumps. */
char *vec_json_print(const cJSON *j);

#endif /* VEC_JSON_H */
