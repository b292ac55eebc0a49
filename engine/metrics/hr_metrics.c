/*
 * The metrics registry, its Prometheus text rendering and the request log.
 *
 * Every label set is bounded and known in advance (request kinds, wire
 * error codes, data planes, layout tags), so the registry is a set of
 * fixed arrays: counting never allocates, and rendering walks the arrays
 * in a fixed order, printing the label sets that were seen.
 */
#include <hurray/metrics.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hr_internal.h"

#define NKIND 5 /* index: HR_XFER_* (0 unused) */
/* Results: 0 ok, 1..HR_WIRE_ERROR_LAST a wire code, then two local ones. */
#define RES_CLOSED (HR_WIRE_ERROR_LAST + 1)
#define RES_FAILED (HR_WIRE_ERROR_LAST + 2)
#define NRES (HR_WIRE_ERROR_LAST + 3)
#define NCODE (HR_WIRE_ERROR_LAST + 1)
#define NPLANE 3
#define LINE_MAX_BYTES 16384
#define LABEL_MAX 1024

enum { DIR_SENT = 0, DIR_RECV = 1 };
enum { SCOPE_STREAM = 0, SCOPE_CONN = 1 };

typedef struct histo {
  uint64_t counts[HR_METRICS_MAX_BUCKETS + 1]; /* per bucket, +Inf last */
  double sum;
  uint64_t count;
} histo;

struct hr_metrics {
  hr_mem mem;
  double bounds[HR_METRICS_MAX_BUCKETS];
  size_t nbounds;
  char *label; /* `name="escaped value"`, or NULL */
  hr_log_fn log;
  void *log_ud;
  int level;
  /* Chained engine callbacks (hr_metrics_attach). */
  int attached;
  void (*next_transfer)(hr_conn *, const hr_transfer_record *, void *);
  void (*next_request)(hr_conn *, const hr_transfer_record *, void *);
  void (*next_conn)(hr_conn *, int, void *);
  void (*next_wakeup)(hr_engine *, void *);
  void *next_ud;

  uint64_t requests[NKIND][NRES];
  uint64_t bytes[2][NPLANE];
  uint64_t transcodes[256];     /* by the layout sent */
  uint64_t errors[NCODE][2][2]; /* code, direction, scope */
  uint64_t conn_opened, conn_closed, conn_rejected;
  uint64_t active_conns, active_streams;
  histo latency[NKIND];
  char *line; /* LINE_MAX_BYTES: the log line being built */
  /* The log timestamp up to the seconds, redone when the second changes:
   * formatting dates is most of a line's cost otherwise. */
  long ts_sec;
  char ts_prefix[80]; /* "2026-11-29T16:34:35." (room for any int) */
};

static const double default_buckets[] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1,      2.5,   5,    10,    30,   60};

static const char *const kind_names[NKIND] = {"", "get", "put", "list", "ping"};
static const char *const plane_names[NPLANE] = {"frames", "rdma", "shm"};
static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* ---- configuration ------------------------------------------------------- */

void hr_metrics_config_default(hr_metrics_config *c) {
  memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  c->log_level = HR_LOG_INFO;
}

int hr_log_level_parse(const char *name, int *level) {
  int i;

  if (!name || !level)
    return HR_ERR_INVALID_ARGUMENT;
  for (i = 0; i < 4; i++) {
    if (strcmp(name, level_names[i]) == 0) {
      *level = i;
      return 0;
    }
  }
  return HR_ERR_INVALID_ARGUMENT;
}

static int label_name_ok(const char *n) {
  size_t i;

  if (!n || !n[0] || (n[0] == '_' && n[1] == '_'))
    return 0;
  for (i = 0; n[i]; i++) {
    char ch = n[i];
    int alpha =
        (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
    if (!alpha && !(i > 0 && ch >= '0' && ch <= '9'))
      return 0;
  }
  return i <= 128;
}

/*
 * Escapes a label value per the text format: backslash, double quote and
 * line feed become \\, \" and \n.  Writes at most cap - 1 bytes and a NUL;
 * returns the escaped length, or (size_t)-1 when it does not fit.
 */
size_t hr__metrics_escape_label(char *dst, size_t cap, const char *src,
                                size_t len);
size_t hr__metrics_escape_label(char *dst, size_t cap, const char *src,
                                size_t len) {
  size_t i, o = 0;

  for (i = 0; i < len; i++) {
    char ch = src[i];
    const char *rep = ch == '\\'   ? "\\\\"
                      : ch == '"'  ? "\\\""
                      : ch == '\n' ? "\\n"
                                   : NULL;
    size_t n = rep ? 2 : 1;
    if (o + n >= cap)
      return (size_t)-1;
    if (rep) {
      dst[o++] = rep[0];
      dst[o++] = rep[1];
    } else {
      dst[o++] = ch;
    }
  }
  if (o >= cap)
    return (size_t)-1;
  dst[o] = 0;
  return o;
}

int hr_metrics_new(hr_metrics **out, const hr_metrics_config *cfg,
                   const hr_mem *mem) {
  hr_metrics_config def, c;
  hr_metrics *m;
  size_t i;

  if (!out)
    return HR_ERR_INVALID_ARGUMENT;
  *out = NULL;
  hr_metrics_config_default(&def);
  if (!cfg)
    cfg = &def;
  if (cfg->size < offsetof(hr_metrics_config, log_level) + sizeof(int) ||
      cfg->size > sizeof(hr_metrics_config) + 4096)
    return HR_ERR_INVALID_ARGUMENT;
  /* An older caller's shorter struct: the fields it lacks keep their
   * defaults. */
  c = def;
  memcpy(&c, cfg, cfg->size < sizeof c ? cfg->size : sizeof c);
  if (!mem)
    mem = hr_mem_default();
  if (c.log_level < HR_LOG_ERROR || c.log_level > HR_LOG_DEBUG)
    return HR_ERR_INVALID_ARGUMENT;
  if (c.latency_buckets) {
    if (c.latency_bucket_count < 1 ||
        c.latency_bucket_count > HR_METRICS_MAX_BUCKETS)
      return HR_ERR_INVALID_ARGUMENT;
    for (i = 0; i < c.latency_bucket_count; i++) {
      double b = c.latency_buckets[i];
      if (!isfinite(b) || b <= 0 || (i && b <= c.latency_buckets[i - 1]))
        return HR_ERR_INVALID_ARGUMENT;
    }
  }
  if ((c.const_label_name || c.const_label_value) &&
      (!label_name_ok(c.const_label_name) || !c.const_label_value ||
       !hr_utf8_valid((const uint8_t *)c.const_label_value,
                      strlen(c.const_label_value)) ||
       strlen(c.const_label_value) > LABEL_MAX / 2 - 1))
    return HR_ERR_INVALID_ARGUMENT;
  m = hr__mem_calloc(mem, 1, sizeof *m);
  if (!m)
    return HR_ERR_NOMEM;
  m->mem = *mem;
  if (c.latency_buckets) {
    memcpy(m->bounds, c.latency_buckets,
           c.latency_bucket_count * sizeof(double));
    m->nbounds = c.latency_bucket_count;
  } else {
    memcpy(m->bounds, default_buckets, sizeof default_buckets);
    m->nbounds = sizeof default_buckets / sizeof default_buckets[0];
  }
  m->log = c.log;
  m->log_ud = c.log_user_data;
  m->level = c.log_level;
  m->line = hr__mem_malloc(mem, LINE_MAX_BYTES);
  if (!m->line)
    goto nomem;
  if (c.const_label_name) {
    size_t nl = strlen(c.const_label_name);
    m->label = hr__mem_malloc(mem, nl + 4 + LABEL_MAX);
    if (!m->label)
      goto nomem;
    memcpy(m->label, c.const_label_name, nl);
    m->label[nl] = '=';
    m->label[nl + 1] = '"';
    /* The length check above leaves room for every byte doubling. */
    size_t el = hr__metrics_escape_label(m->label + nl + 2, LABEL_MAX,
                                         c.const_label_value,
                                         strlen(c.const_label_value));
    m->label[nl + 2 + el] = '"';
    m->label[nl + 3 + el] = 0;
  }
  *out = m;
  return 0;
nomem:
  hr_metrics_del(m);
  return HR_ERR_NOMEM;
}

void hr_metrics_del(hr_metrics *m) {
  if (!m)
    return;
  hr__mem_free(&m->mem, m->line);
  hr__mem_free(&m->mem, m->label);
  hr__mem_free(&m->mem, m);
}

int hr_metrics_set_log_level(hr_metrics *m, int level) {
  if (!m || level < HR_LOG_ERROR || level > HR_LOG_DEBUG)
    return HR_ERR_INVALID_ARGUMENT;
  m->level = level;
  return 0;
}

/* ---- JSON line building -------------------------------------------------- */

typedef struct jbuf {
  char *p;
  size_t len, cap; /* cap leaves room for the NUL */
  int cut;
} jbuf;

static void jraw(jbuf *b, const char *s, size_t n) {
  if (b->cut || n > b->cap - b->len) {
    b->cut = 1;
    return;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void jputs(jbuf *b, const char *s) {
  jraw(b, s, strlen(s));
}

/* Decimal digits of v, at least `min` of them (zero-padded). */
static void jnum(jbuf *b, uint64_t v, int min) {
  char d[24];
  int n = 0;

  do {
    d[sizeof d - 1 - n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v || n < min);
  jraw(b, d + sizeof d - n, (size_t)n);
}

/* ,"name": */
static void jkey(jbuf *b, const char *name) {
  jraw(b, ",\"", 2);
  jputs(b, name);
  jraw(b, "\":", 2);
}

/* ,"name":"text" for text that needs no escaping (our own names). */
static void jname(jbuf *b, const char *name, const char *text) {
  jkey(b, name);
  jraw(b, "\"", 1);
  jputs(b, text);
  jraw(b, "\"", 1);
}

static void jprintf(jbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void jprintf(jbuf *b, const char *fmt, ...) {
  va_list ap;
  int n;

  if (b->cut)
    return;
  va_start(ap, fmt);
  n = vsnprintf(b->p + b->len, b->cap - b->len + 1, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n > b->cap - b->len) {
    b->cut = 1;
    return;
  }
  b->len += (size_t)n;
}

/* A JSON string of UTF-8 text (the caller checked it): quotes, backslash
 * and control characters escaped. */
static void jstr(jbuf *b, const char *s, size_t n) {
  size_t i;
  char esc[8];

  jraw(b, "\"", 1);
  for (i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    size_t run = i;
    /* Copy a run of bytes that need no escape in one go. */
    while (run < n && (unsigned char)s[run] >= 0x20 && s[run] != '"' &&
           s[run] != '\\' && s[run] != 0x7f)
      run++;
    if (run > i) {
      jraw(b, s + i, run - i);
      i = run - 1;
      continue;
    }
    if (ch == '"' || ch == '\\') {
      esc[0] = '\\';
      esc[1] = (char)ch;
      jraw(b, esc, 2);
    } else if (ch == '\n') {
      jraw(b, "\\n", 2);
    } else if (ch == '\r') {
      jraw(b, "\\r", 2);
    } else if (ch == '\t') {
      jraw(b, "\\t", 2);
    } else if (ch < 0x20 || ch == 0x7f) {
      snprintf(esc, sizeof esc, "\\u%04x", ch);
      jraw(b, esc, 6);
    } else {
      jraw(b, (const char *)&s[i], 1);
    }
  }
  jraw(b, "\"", 1);
}

/* A key-value pair for text that may not be UTF-8 (a peer's key): as
 * text when valid, else "<name>_hex" with its bytes in hex. */
static void jbytes(jbuf *b, const char *name, const uint8_t *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  size_t i;

  if (hr_utf8_valid(s, n)) {
    jprintf(b, ",\"%s\":", name);
    jstr(b, (const char *)s, n);
    return;
  }
  jprintf(b, ",\"%s_hex\":\"", name);
  for (i = 0; i < n; i++) {
    char h[2] = {hex[s[i] >> 4], hex[s[i] & 15]};
    jraw(b, h, 2);
  }
  jraw(b, "\"", 1);
}

static void jstart(hr_metrics *m, jbuf *b, int level, const char *event) {
  struct timespec ts;
  struct tm tm;

  b->p = m->line;
  b->len = 0;
  b->cap = LINE_MAX_BYTES - 1;
  b->cut = 0;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (!m->ts_prefix[0] || (long)ts.tv_sec != m->ts_sec) {
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(m->ts_prefix, sizeof m->ts_prefix,
             "%04d-%02d-%02dT%02d:%02d:%02d.", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    m->ts_sec = (long)ts.tv_sec;
  }
  jputs(b, "{\"ts\":\"");
  jputs(b, m->ts_prefix);
  jnum(b, (uint64_t)ts.tv_nsec / 1000000, 3);
  jraw(b, "Z\"", 2);
  jname(b, "level", level_names[level]);
  jkey(b, "event");
  jstr(b, event, strlen(event));
}

static void jfinish(hr_metrics *m, jbuf *b, int level) {
  jraw(b, "}", 1);
  if (b->cut) {
    /* Only a free-form text full of control bytes can get here (a key
     * is 1 KiB, a message 256 bytes): say so rather than emit broken
     * JSON. */
    jstart(m, b, level, "log_line_too_long");
    jraw(b, "}", 1);
  }
  b->p[b->len] = 0;
  m->log(level, b->p, b->len, m->log_ud);
}

static int log_on(const hr_metrics *m, int level) {
  return m->log && level <= m->level;
}

/* Replaces every byte that does not start a valid UTF-8 sequence with
 * '?' (a file name in another encoding, a sequence cut by vsnprintf), so
 * the line stays valid JSON. */
static void utf8_scrub(char *s, size_t n) {
  size_t i = 0;

  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (len > n - i || !hr_utf8_valid((const uint8_t *)s + i, len)) {
      s[i++] = '?';
      continue;
    }
    i += len;
  }
}

void hr_metrics_log(hr_metrics *m, int level, const char *event,
                    const char *fmt, ...) {
  char text[4096];
  va_list ap;
  jbuf b;
  size_t n;

  if (!m || !fmt || level < HR_LOG_ERROR || level > HR_LOG_DEBUG ||
      !log_on(m, level))
    return;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  n = strlen(text);
  utf8_scrub(text, n);
  if (!event || !hr_utf8_valid((const uint8_t *)event, strlen(event)))
    event = "log";
  jstart(m, &b, level, event);
  jputs(&b, ",\"msg\":");
  jstr(&b, text, n);
  jfinish(m, &b, level);
}

/* ---- feeding ------------------------------------------------------------- */

static unsigned code_index(uint32_t wire) {
  /* Reserved codes are treated as INTERNAL (§ 12). */
  return wire > HR_WIRE_ERROR_LAST ? HR_WIRE_INTERNAL : wire;
}

static unsigned result_index(const hr_transfer_record *rec) {
  if (rec->status == 0)
    return 0;
  if (rec->wire_error)
    return code_index(rec->wire_error);
  return rec->status == HR_ERR_CLOSED ? RES_CLOSED : RES_FAILED;
}

static const char *result_name(unsigned r) {
  if (r == 0)
    return "ok";
  if (r == RES_CLOSED)
    return "closed";
  if (r == RES_FAILED)
    return "failed";
  return hr_wire_error_name(r);
}

static void histo_add(const hr_metrics *m, histo *h, double v) {
  size_t i = 0;

  while (i < m->nbounds && v > m->bounds[i])
    i++;
  h->counts[i]++;
  h->sum += v;
  h->count++;
}

void hr_metrics_record(hr_metrics *m, const char *peer,
                       const hr_transfer_record *rec) {
  unsigned kind, res, plane;
  int client, level;
  double secs = 0;
  jbuf b;

  if (!m || !rec)
    return;
  kind = rec->kind < NKIND ? rec->kind : 0;
  if (kind == 0)
    return;
  res = result_index(rec);
  client = rec->transcoded < 0;
  if (rec->finished > rec->started)
    secs = (double)(rec->finished - rec->started) / 1e9;
  /* A sharded answer is one request: its other shard streams add bytes
   * and errors only. */
  if (rec->shard_index == 0) {
    m->requests[kind][res]++;
    histo_add(m, &m->latency[kind], secs);
  }
  plane = rec->data_plane < NPLANE ? rec->data_plane : HR_PLANE_FRAMES;
  if (kind == HR_XFER_GET || kind == HR_XFER_PUT) {
    int sent = (kind == HR_XFER_GET) != client;
    m->bytes[sent ? DIR_SENT : DIR_RECV][plane] += rec->bytes;
    if (rec->transcoded > 0 && rec->status == 0 && rec->shard_index == 0)
      m->transcodes[rec->layout]++;
  }
  if (rec->wire_error)
    m->errors[code_index(rec->wire_error)]
             [rec->wire_error_sent ? DIR_SENT : DIR_RECV][SCOPE_STREAM]++;

  level = rec->status == 0 ? (kind == HR_XFER_PING ? HR_LOG_DEBUG : HR_LOG_INFO)
                           : HR_LOG_WARN;
  if (!log_on(m, level))
    return;
  jstart(m, &b, level, "request");
  jputs(&b, ",\"peer\":");
  jstr(&b, peer ? peer : "", peer ? strlen(peer) : 0);
  jname(&b, "kind", kind_names[kind]);
  if (rec->key)
    jbytes(&b, "key", rec->key, rec->key_len);
  jkey(&b, "stream");
  jnum(&b, rec->stream_id, 1);
  if (kind == HR_XFER_GET || kind == HR_XFER_PUT) {
    jname(&b, "layout", hr_layout_name(rec->layout));
    if (rec->transcoded >= 0) {
      jkey(&b, "transcoded");
      jputs(&b, rec->transcoded ? "true" : "false");
    }
    jname(&b, "plane", plane_names[plane]);
    jkey(&b, "bytes");
    jnum(&b, rec->bytes, 1);
    if (rec->fallback[0]) {
      size_t n = strnlen(rec->fallback, sizeof rec->fallback);
      jkey(&b, "fallback");
      if (hr_utf8_valid((const uint8_t *)rec->fallback, n))
        jstr(&b, rec->fallback, n);
      else
        jstr(&b, "", 0);
    }
    if (rec->shards > 1) {
      jkey(&b, "shard");
      jnum(&b, rec->shard_index, 1);
      jkey(&b, "shards");
      jnum(&b, rec->shards, 1);
    }
  }
  /* Milliseconds with 3 decimals, from the integer nanoseconds. */
  uint64_t us =
      rec->finished > rec->started ? (rec->finished - rec->started) / 1000 : 0;
  jkey(&b, "duration_ms");
  jnum(&b, us / 1000, 1);
  jraw(&b, ".", 1);
  jnum(&b, us % 1000, 3);
  jname(&b, "result", result_name(res));
  if (rec->status) {
    jprintf(&b, ",\"error\":\"%s\",\"error_sent\":%s",
            rec->wire_error ? hr_wire_error_name(rec->wire_error)
                            : hr_strerror(rec->status),
            rec->wire_error && rec->wire_error_sent ? "true" : "false");
    if (rec->message[0]) {
      size_t n = strnlen(rec->message, sizeof rec->message);
      jputs(&b, ",\"message\":");
      if (hr_utf8_valid((const uint8_t *)rec->message, n))
        jstr(&b, rec->message, n);
      else
        jstr(&b, "", 0);
    }
  }
  jfinish(m, &b, level);
}

void hr_metrics_conn(hr_metrics *m, const char *peer, int event,
                     uint32_t wire_error, int sent) {
  int level;
  const char *name;
  jbuf b;

  if (!m)
    return;
  switch (event) {
  case HR_CONN_OPENED:
    m->conn_opened++;
    name = "conn_open";
    level = HR_LOG_DEBUG;
    break;
  case HR_CONN_CLOSED:
    m->conn_closed++;
    name = "conn_close";
    level = HR_LOG_DEBUG;
    if (wire_error) {
      m->errors[code_index(wire_error)][sent ? DIR_SENT : DIR_RECV]
               [SCOPE_CONN]++;
      level = HR_LOG_WARN;
    }
    break;
  case HR_CONN_REJECTED:
    m->conn_rejected++;
    name = "conn_reject";
    level = HR_LOG_WARN;
    m->errors[HR_WIRE_RESOURCE_EXHAUSTED][DIR_SENT][SCOPE_CONN]++;
    break;
  default: return;
  }
  if (!log_on(m, level))
    return;
  jstart(m, &b, level, name);
  jputs(&b, ",\"peer\":");
  jstr(&b, peer ? peer : "", peer ? strlen(peer) : 0);
  if (event == HR_CONN_CLOSED && wire_error)
    jprintf(&b, ",\"error\":\"%s\",\"error_sent\":%s",
            hr_wire_error_name(wire_error), sent ? "true" : "false");
  jfinish(m, &b, level);
}

void hr_metrics_set_active(hr_metrics *m, uint64_t connections,
                           uint64_t streams) {
  if (!m)
    return;
  m->active_conns = connections;
  m->active_streams = streams;
}

void hr_metrics_sample(hr_metrics *m, const hr_engine *e) {
  if (m && e)
    hr_metrics_set_active(m, hr_engine_conn_count(e),
                          hr_engine_stream_count(e));
}

/* ---- the engine glue ----------------------------------------------------- */

static void tr_transfer(hr_conn *c, const hr_transfer_record *rec, void *ud) {
  hr_metrics *m = ud;

  hr_metrics_record(m, hr_conn_peer(c), rec);
  if (m->next_transfer)
    m->next_transfer(c, rec, m->next_ud);
}

static void tr_request(hr_conn *c, const hr_transfer_record *rec, void *ud) {
  hr_metrics *m = ud;

  hr_metrics_record(m, hr_conn_peer(c), rec);
  if (m->next_request)
    m->next_request(c, rec, m->next_ud);
}

static void tr_conn(hr_conn *c, int event, void *ud) {
  hr_metrics *m = ud;
  uint32_t wire = 0;
  int sent = 0;

  if (event == HR_CONN_CLOSED)
    hr_conn_error(c, &wire, &sent, NULL);
  hr_metrics_conn(m, hr_conn_peer(c), event, wire, sent);
  if (m->next_conn)
    m->next_conn(c, event, m->next_ud);
}

static void tr_wakeup(hr_engine *e, void *ud) {
  hr_metrics *m = ud;

  m->next_wakeup(e, m->next_ud);
}

int hr_metrics_attach(hr_metrics *m, hr_engine_config *cfg) {
  if (!m || !cfg)
    return HR_ERR_INVALID_ARGUMENT;
  if (m->attached)
    return HR_ERR_STATE;
  m->attached = 1;
  m->next_transfer = cfg->on_transfer;
  m->next_request = cfg->on_request;
  m->next_conn = cfg->on_conn;
  m->next_wakeup = cfg->on_wakeup;
  m->next_ud = cfg->user_data;
  cfg->on_transfer = tr_transfer;
  cfg->on_request = tr_request;
  cfg->on_conn = tr_conn;
  if (cfg->on_wakeup)
    cfg->on_wakeup = tr_wakeup;
  cfg->user_data = m;
  return 0;
}

/* ---- rendering ----------------------------------------------------------- */

typedef struct out {
  hr_metrics_write_fn write;
  void *ud;
  int failed;
  char buf[4096];
  size_t len;
} out;

static void o_flush(out *o) {
  if (o->len && !o->failed && o->write(o->buf, o->len, o->ud) != 0)
    o->failed = 1;
  o->len = 0;
}

static void o_printf(out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void o_printf(out *o, const char *fmt, ...) {
  va_list ap;
  int n;

  if (o->failed)
    return;
  va_start(ap, fmt);
  n = vsnprintf(o->buf + o->len, sizeof o->buf - o->len, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n >= sizeof o->buf - o->len) {
    /* Did not fit: flush and write it again (every line is < 2 KiB). */
    o_flush(o);
    va_start(ap, fmt);
    n = vsnprintf(o->buf, sizeof o->buf, fmt, ap);
    va_end(ap);
  }
  if (n < 0 || (size_t)n >= sizeof o->buf - o->len) {
    o->failed = 1;
    return;
  }
  o->len += (size_t)n;
}

static void header(out *o, const char *name, const char *type,
                   const char *help) {
  o_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The label block: `{const,labels}` (labels: "a=\"b\"" or ""). */
static void sample(out *o, const hr_metrics *m, const char *name,
                   const char *labels, const char *value) {
  int have = labels[0] != 0, constl = m->label != NULL;

  if (!have && !constl)
    o_printf(o, "%s %s\n", name, value);
  else
    o_printf(o, "%s{%s%s%s} %s\n", name, constl ? m->label : "",
             constl && have ? "," : "", labels, value);
}

static void sample_u64(out *o, const hr_metrics *m, const char *name,
                       const char *labels, uint64_t v) {
  char num[24];

  snprintf(num, sizeof num, "%llu", (unsigned long long)v);
  sample(o, m, name, labels, num);
}

/* A float as the text format wants it: shortest round-trip form. */
static void fmt_double(char *dst, size_t cap, double v) {
  int prec;

  for (prec = 6; prec <= 17; prec++) {
    snprintf(dst, cap, "%.*g", prec, v);
    if (strtod(dst, NULL) == v)
      return;
  }
}

int hr_metrics_render(const hr_metrics *m, hr_metrics_write_fn write,
                      void *user_data) {
  out *o;
  char labels[256], num[40];
  unsigned k, r, d, p, c, sc;
  size_t i;
  static const char *const dir_names[2] = {"sent", "received"};
  static const char *const scope_names[2] = {"stream", "connection"};
  int rv;

  if (!m || !write)
    return HR_ERR_INVALID_ARGUMENT;
  o = hr__mem_calloc(&m->mem, 1, sizeof *o);
  if (!o)
    return HR_ERR_NOMEM;
  o->write = write;
  o->ud = user_data;

  header(o, "hurray_requests_total", "counter",
         "Requests finished, by kind (get, put, list, ping) and result (ok, "
         "a wire error name, closed, failed).");
  for (k = 1; k < NKIND; k++)
    for (r = 0; r < NRES; r++)
      if (m->requests[k][r]) {
        snprintf(labels, sizeof labels, "kind=\"%s\",result=\"%s\"",
                 kind_names[k], result_name(r));
        sample_u64(o, m, "hurray_requests_total", labels, m->requests[k][r]);
      }

  header(o, "hurray_tensor_bytes_total", "counter",
         "Tensor bytes moved by finished GETs and PUTs, by direction and "
         "data plane.");
  for (d = 0; d < 2; d++)
    for (p = 0; p < NPLANE; p++)
      if (m->bytes[d][p] || p == HR_PLANE_FRAMES) {
        snprintf(labels, sizeof labels, "direction=\"%s\",plane=\"%s\"",
                 dir_names[d], plane_names[p]);
        sample_u64(o, m, "hurray_tensor_bytes_total", labels, m->bytes[d][p]);
      }

  header(o, "hurray_transcodes_total", "counter",
         "GETs answered in a layout other than the stored one, by the "
         "layout sent.");
  for (i = 0; i < 256; i++)
    if (m->transcodes[i]) {
      snprintf(labels, sizeof labels, "layout=\"%s\"",
               hr_layout_name((uint8_t)i));
      sample_u64(o, m, "hurray_transcodes_total", labels, m->transcodes[i]);
    }

  header(o, "hurray_errors_total", "counter",
         "Wire ERRORs, by code, direction (sent, received) and scope "
         "(stream, connection).");
  for (c = 0; c < NCODE; c++)
    for (d = 0; d < 2; d++)
      for (sc = 0; sc < 2; sc++)
        if (m->errors[c][d][sc]) {
          snprintf(labels, sizeof labels,
                   "code=\"%s\",direction=\"%s\",scope=\"%s\"",
                   hr_wire_error_name(c), dir_names[d], scope_names[sc]);
          sample_u64(o, m, "hurray_errors_total", labels, m->errors[c][d][sc]);
        }

  header(o, "hurray_connections_opened_total", "counter",
         "Connections opened (accepted, or connected).");
  sample_u64(o, m, "hurray_connections_opened_total", "", m->conn_opened);
  header(o, "hurray_connections_closed_total", "counter",
         "Connections closed.");
  sample_u64(o, m, "hurray_connections_closed_total", "", m->conn_closed);
  header(o, "hurray_connections_rejected_total", "counter",
         "Connections refused over max_connections.");
  sample_u64(o, m, "hurray_connections_rejected_total", "", m->conn_rejected);
  header(o, "hurray_connections_active", "gauge", "Connections open now.");
  sample_u64(o, m, "hurray_connections_active", "", m->active_conns);
  header(o, "hurray_streams_active", "gauge",
         "Streams open now across the connections.");
  sample_u64(o, m, "hurray_streams_active", "", m->active_streams);

  header(o, "hurray_request_duration_seconds", "histogram",
         "Time from a request's arrival to its last byte or its answer, by "
         "kind.");
  for (k = 1; k < NKIND; k++) {
    const histo *h = &m->latency[k];
    uint64_t cum = 0;
    for (i = 0; i <= m->nbounds; i++) {
      cum += h->counts[i];
      if (i < m->nbounds)
        fmt_double(num, sizeof num, m->bounds[i]);
      else
        snprintf(num, sizeof num, "+Inf");
      snprintf(labels, sizeof labels, "kind=\"%s\",le=\"%s\"", kind_names[k],
               num);
      sample_u64(o, m, "hurray_request_duration_seconds_bucket", labels, cum);
    }
    snprintf(labels, sizeof labels, "kind=\"%s\"", kind_names[k]);
    fmt_double(num, sizeof num, h->sum);
    sample(o, m, "hurray_request_duration_seconds_sum", labels, num);
    sample_u64(o, m, "hurray_request_duration_seconds_count", labels, h->count);
  }
  o_flush(o);
  rv = o->failed ? HR_ERR_CALLBACK_FAILURE : 0;
  hr__mem_free(&m->mem, o);
  return rv;
}
