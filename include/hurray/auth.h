/*
 * libhurray: AUTH_TOKEN checking on a server.
 *
 * An hr_auth is a table of tokens, each with its permissions: read-only
 * (GET and LIST) or read-write (GET, LIST and PUT), and optionally a set
 * of key prefixes that bounds the keys it may touch.  hr_auth_wrap() puts
 * it in front of any provider (<hurray/session.h>), so every server built
 * on libhurray, not only `hurray serve`, can use it:
 *
 *   - the CLIENT_HELLO must carry an AUTH_TOKEN found in the table, or the
 *     server answers ERROR UNAUTHORIZED on stream 0 and closes before it
 *     has read any request;
 *   - a GET (plain, REGION or parallel) of a key outside the token's
 *     prefixes is answered UNAUTHORIZED whether the key exists or not, so
 *     the answer says nothing about other keys;
 *   - a PUT needs a read-write token and a key inside its prefixes
 *     (UNAUTHORIZED otherwise), and is checked again at its commit;
 *   - a LIST only shows keys inside the token's prefixes.
 *
 * Every request is checked against the table as it is at that moment, so
 * a reload (hr_auth_load*) applies to connections already open: a revoked
 * token's next request is refused, transfers under way finish.
 *
 * The table keeps SHA-256 digests, never the tokens; a presented token is
 * hashed and compared with every entry by CRYPTO_memcmp(), in time that
 * does not depend on where (or whether) it matches.
 *
 * Token file format (hr_auth_load / hr_auth_load_file), one entry a line:
 *
 *     TOKEN [ro|rw] [PREFIX ...]
 *
 * Fields are separated by spaces or tabs.  TOKEN is 1 to 4096 bytes
 * without whitespace.  `ro` allows GET and LIST, `rw` PUT too; a line with
 * only a TOKEN is `rw` (PUT still needs a provider that takes PUTs: with
 * `hurray serve`, --allow-put).  PREFIXes (at most 64, each at most 1024
 * bytes) restrict the keys to those starting with one of them; none means
 * every key.  A line whose first non-blank character is `#` is a comment;
 * blank lines are ignored; a line may end in CRLF.  A token listed twice
 * is an error.  An empty table refuses every client.
 *
 * Thread safety: every function may be called from any thread (a reload
 * swaps the table under a lock); one hr_auth may front several providers
 * and engines.
 */
#ifndef HURRAY_AUTH_H
#define HURRAY_AUTH_H

#include <hurray/common.h>
#include <hurray/session.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_auth hr_auth;

/* Permission bits (hr_auth_check). */
#define HR_AUTH_READ 1u  /* GET, LIST */
#define HR_AUTH_WRITE 2u /* PUT */

/* Limits of the token file. */
#define HR_AUTH_MAX_TOKEN 4096
#define HR_AUTH_MAX_PREFIXES 64

/* Creates an empty table (every client refused until a load).  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM. */
HR_EXTERN int hr_auth_new(hr_auth **out, const hr_mem *mem);

/* Frees the table and the wrappers made by hr_auth_wrap().  No session
 * may use those wrappers any more.  NULL is a no-op. */
HR_EXTERN void hr_auth_del(hr_auth *a);

/*
 * Parses `text` (len bytes, the file format above) and, when all of it is
 * valid, replaces the table atomically; otherwise the table is unchanged
 * and `why` (may be NULL) receives one line naming the line number and
 * the fault.  Returns 0, HR_ERR_INVALID_ARGUMENT (NULL a, NULL text with
 * len > 0, a malformed line, or a NUL byte), HR_ERR_NOMEM,
 * HR_ERR_INTERNAL (OpenSSL could not compute a SHA-256 digest).
 */
HR_EXTERN int hr_auth_load(hr_auth *a, const char *text, size_t len,
                           char *why, size_t why_len);

/* hr_auth_load() of a file's contents (at most 16 MiB), with its return
 * codes; also HR_ERR_INVALID_ARGUMENT for a NULL path or a larger file,
 * HR_ERR_IO when the file cannot be read (why says so). */
HR_EXTERN int hr_auth_load_file(hr_auth *a, const char *path, char *why,
                                size_t why_len);

/* Tokens in the table now. */
HR_EXTERN size_t hr_auth_count(const hr_auth *a);

/*
 * Decides whether `token` may do `need` (HR_AUTH_READ / HR_AUTH_WRITE;
 * 0: only that the token is known) on `key` (NULL: any key, i.e. no
 * prefix check).  Returns 0 when allowed, HR_ERR_NOT_FOUND for an unknown
 * (or NULL) token, HR_ERR_STATE when the token is known but lacks the
 * permission or the key is outside its prefixes, HR_ERR_INVALID_ARGUMENT
 * for a NULL `a` or a NULL token with token_len > 0.  Thread-safe; it
 * keeps no pointer to its arguments.
 */
HR_EXTERN int hr_auth_check(hr_auth *a, const uint8_t *token,
                            size_t token_len, unsigned need,
                            const uint8_t *key, size_t key_len);

/*
 * Fills `out` with a provider that checks every connection and request
 * against `a` (see above) and passes what is allowed to `inner` (copied).
 * The wrapper supports what `inner` supports (its NULL members stay NULL)
 * and calls inner's on_hello after the token was accepted.  `out` may
 * be `inner`.  The wrapper lives as long as `a`.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_auth_wrap(hr_auth *a, const hr_provider *inner,
                           hr_provider *out);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_AUTH_H */
