/*
 * The `hurray` command, run as a user would: serve the sample files of
 * examples/data, then get (plain, transcoded, converted locally, region,
 * parallel, --stats parsed with cJSON, --dump-wire), put, ls, inspect,
 * the one-line error reports and exit codes, and the graceful drain on
 * SIGTERM with a transfer in flight.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <hurray/files.h>
#include <hurray/session.h>

#include "common/cli_harness.h"
#include "tl.h"

CH_CLI_DEFINE(HURRAY_BIN);
static char url[64];
static int port;
static pid_t server_pid;

static const char *tpath(const char *name) {
  return ch_path(&H, name);
}

/* Runs `hurray ARGS...`; stdout and stderr land in `out` and `err`.
 * Returns the exit status. */
#define RUN(...) CH_RUN(&H, __VA_ARGS__)

/* Starts `hurray serve --listen 127.0.0.1:0 ARGS...` (up to three);
 * returns its pid and sets *p from its first line. */
static pid_t start_server(int *p, const char *a1, const char *a2,
                          const char *a3) {
  return ch_serve(&H, (const char *const[]){a1, a2, a3, NULL}, p, NULL);
}

static int setup(void **state) {
  (void)state;
  if (ch_tmpdir(&H, "hr_cli"))
    return -1;
  server_pid =
      start_server(&port, "--allow-put", HR_SOURCE_DIR "/examples/data", NULL);
  snprintf(url, sizeof url, "hurray://127.0.0.1:%d", port);
  return 0;
}

static int teardown(void **state) {
  int st;

  (void)state;
  st = ch_stop(server_pid);
  return ch_rmdir(&H) == 0 && st == 0 ? 0 : -1;
}

static hr_tensor *load(const char *path) {
  hr_tensor *t = NULL;
  char why[256];
  if (hr_npy_load(&t, path, NULL, why, sizeof why) != 0)
    fail_msg("%s: %s", path, why);
  return t;
}

static cJSON *stats_of(const char *s) {
  const char *brace = strchr(s, '{');
  cJSON *j;
  assert_non_null(brace);
  j = cJSON_Parse(brace);
  assert_non_null(j);
  return j;
}

static void test_ls(void **state) {
  (void)state;
  assert_int_equal(RUN("ls", url, NULL), 0);
  assert_non_null(strstr(out, "matrix\tFLOAT32\t[4,6]\tROW_MAJOR\t96\n"));
  assert_non_null(strstr(out, "fortran\tFLOAT64\t[3,5]\tCOLUMN_MAJOR\t120"));
  assert_non_null(strstr(out, "ints/counts\tINT32\t[10]"));
  assert_non_null(strstr(out, "model/lm_head.bias\tBFLOAT16\t[8]"));
  assert_true(strstr(out, "flags") < strstr(out, "matrix"));
  assert_int_equal(RUN("ls", url, "model/", NULL), 0);
  assert_null(strstr(out, "matrix"));
  assert_non_null(strstr(out, "model/norm.scale\tFLOAT16"));
}

static void test_get_plain_and_stats(void **state) {
  hr_tensor *ref = load(HR_SOURCE_DIR "/examples/data/matrix.npy"), *got;
  cJSON *j;

  (void)state;
  assert_int_equal(
      RUN("get", "--stats", "-o", tpath("m.npy"), url, "matrix", NULL), 0);
  got = load(tpath("m.npy"));
  assert_memory_equal(hr_tensor_buffer(got, 0), hr_tensor_buffer(ref, 0), 96);
  hr_tensor_unref(got);
  /* Exactly one JSON line on stderr. */
  ch_single_line(err);
  j = stats_of(err);
  assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                      "frames");
  assert_string_equal(cJSON_GetObjectItem(j, "layout")->valuestring,
                      "ROW_MAJOR");
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "transcoded")));
  assert_string_equal(cJSON_GetObjectItem(j, "device")->valuestring, "cpu");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "fallback")));
  assert_int_equal(cJSON_GetObjectItem(j, "shards")->valueint, 1);
  assert_int_equal(cJSON_GetObjectItem(j, "lanes")->valueint, 1);
  assert_int_equal(cJSON_GetObjectItem(j, "bytes")->valueint, 96);
  assert_true(cJSON_GetObjectItem(j, "seconds")->valuedouble >= 0);
  cJSON_Delete(j);
  hr_tensor_unref(ref);
}

/* --device sim: received into (simulated) device memory through pinned
 * staging, copied back for -o. */
static void test_get_device(void **state) {
  hr_tensor *ref = load(HR_SOURCE_DIR "/examples/data/matrix.npy"), *got;

  (void)state;
  assert_int_equal(
      RUN("get", "--device", "sim", "-o", tpath("d.npy"), url, "matrix", NULL),
      0);
  got = load(tpath("d.npy"));
  assert_memory_equal(hr_tensor_buffer(got, 0), hr_tensor_buffer(ref, 0), 96);
  hr_tensor_unref(got);
  hr_tensor_unref(ref);
  assert_int_equal(RUN("get", "--device", "sim", "--parallel", "2", url,
                       "matrix", NULL),
                   2);
  ch_one_line(err);
}

static void test_get_layouts(void **state) {
  hr_tensor *ref = load(HR_SOURCE_DIR "/examples/data/matrix.npy"), *got;
  uint64_t off[2] = {1, 2};
  cJSON *j;

  (void)state;
  /* Column-major from the server: a Fortran-order .npy. */
  assert_int_equal(RUN("get", "--layout", "column-major", "--allow-transcode",
                       "--stats", "-o", tpath("f.npy"), url, "matrix", NULL),
                   0);
  got = load(tpath("f.npy"));
  assert_int_equal(hr_tensor_descriptor(got)->layout.tag,
                   HR_LAYOUT_COLUMN_MAJOR);
  assert_true(tl_same_elements(ref, NULL, got));
  hr_tensor_unref(got);
  j = stats_of(err);
  assert_string_equal(cJSON_GetObjectItem(j, "layout")->valuestring,
                      "COLUMN_MAJOR");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "transcoded")));
  cJSON_Delete(j);
  /* Tiled and panel from the server: converted here to C order. */
  assert_int_equal(RUN("get", "--layout", "tiled:3,4", "--allow-transcode",
                       "--stats", "-o", tpath("t.npy"), url, "matrix", NULL),
                   0);
  got = load(tpath("t.npy"));
  assert_int_equal(hr_tensor_descriptor(got)->layout.tag, HR_LAYOUT_ROW_MAJOR);
  assert_true(tl_same_elements(ref, NULL, got));
  hr_tensor_unref(got);
  j = stats_of(err);
  assert_string_equal(cJSON_GetObjectItem(j, "layout")->valuestring, "TILED");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "converted_locally")));
  cJSON_Delete(j);
  assert_int_equal(RUN("get", "--layout", "panel:3", "--allow-transcode", "-o",
                       tpath("p.npy"), url, "matrix", NULL),
                   0);
  got = load(tpath("p.npy"));
  assert_true(tl_same_elements(ref, NULL, got));
  hr_tensor_unref(got);
  assert_int_equal(RUN("get", "--layout", "permuted:1,0", "--allow-transcode",
                       "-o", tpath("q.npy"), url, "matrix", NULL),
                   0);
  got = load(tpath("q.npy"));
  assert_true(tl_same_elements(ref, NULL, got));
  hr_tensor_unref(got);
  /* A region. */
  assert_int_equal(RUN("get", "--region", "1,2:2,3", "-o", tpath("r.npy"), url,
                       "matrix", NULL),
                   0);
  got = load(tpath("r.npy"));
  assert_int_equal(hr_tensor_descriptor(got)->shape[0], 2);
  assert_int_equal(hr_tensor_descriptor(got)->shape[1], 3);
  assert_true(tl_same_elements(ref, off, got));
  hr_tensor_unref(got);
  /* Without -o: a summary line. */
  assert_int_equal(RUN("get", url, "fortran", NULL), 0);
  assert_string_equal(out, "fortran: FLOAT64 [3, 5] COLUMN_MAJOR, 120 bytes\n");
  hr_tensor_unref(ref);
}

static void test_get_safetensors_bf16(void **state) {
  hr_tensor *got;
  const uint16_t *v;

  (void)state;
  assert_int_equal(
      RUN("get", "-o", tpath("b.npy"), url, "model/lm_head.bias", NULL), 0);
  got = load(tpath("b.npy"));
  assert_int_equal(hr_tensor_descriptor(got)->element_type, HR_ELEM_BFLOAT16);
  v = hr_tensor_buffer(got, 0);
  /* bf16(0.5 * i - 1): -1.0 is 0xBF80, 0.0 is 0x0000, 1.0 is 0x3F80. */
  assert_int_equal(v[0], 0xBF80);
  assert_int_equal(v[2], 0x0000);
  assert_int_equal(v[4], 0x3F80);
  hr_tensor_unref(got);
}

static void test_put_and_parallel(void **state) {
  hr_descriptor d;
  hr_tensor *t, *got;
  uint64_t shape[2] = {512, 1024};
  cJSON *j;

  (void)state;
  t = tl_dense(HR_ELEM_FLOAT32, 2, shape, 77);
  d = *hr_tensor_descriptor(t);
  assert_int_equal(
      hr_npy_save(tpath("big.npy"), &d, hr_tensor_buffer(t, 0), NULL, 0), 0);
  assert_int_equal(RUN("put", url, "up/big", tpath("big.npy"), NULL), 0);
  assert_non_null(strstr(out, "stored"));
  assert_int_equal(RUN("put", url, "up/big", tpath("big.npy"), NULL), 1);
  ch_one_line(err);
  assert_non_null(strstr(err, "ALREADY_EXISTS"));
  assert_non_null(strstr(err, "--replace"));
  assert_int_equal(
      RUN("put", "--replace", url, "up/big", tpath("big.npy"), NULL), 0);
  /* From device memory (the simulated device): the same bytes arrive. */
  assert_int_equal(RUN("put", "--device", "sim", "--stats", url, "up/dev",
                       tpath("big.npy"), NULL),
                   0);
  assert_int_equal(RUN("get", "-o", tpath("gd.npy"), url, "up/dev", NULL), 0);
  got = load(tpath("gd.npy"));
  assert_memory_equal(hr_tensor_buffer(got, 0), hr_tensor_buffer(t, 0),
                      hr_tensor_bytes(t));
  hr_tensor_unref(got);
  assert_int_equal(
      RUN("put", "--device", "nowhere", url, "up/x", tpath("big.npy"), NULL),
      2);
  assert_int_equal(RUN("get", "--parallel", "4", "--stats", "-o",
                       tpath("g.npy"), url, "up/big", NULL),
                   0);
  got = load(tpath("g.npy"));
  assert_memory_equal(hr_tensor_buffer(got, 0), hr_tensor_buffer(t, 0),
                      hr_tensor_bytes(t));
  j = stats_of(err);
  assert_true(cJSON_GetObjectItem(j, "shards")->valueint >= 1);
  assert_int_equal((int64_t)cJSON_GetObjectItem(j, "bytes")->valuedouble,
                   hr_tensor_bytes(t));
  cJSON_Delete(j);
  hr_tensor_unref(got);
  hr_tensor_unref(t);
}

static void test_errors(void **state) {
  int fd, p;
  char dead[64];

  (void)state;
  assert_int_equal(RUN("get", url, "no/such", NULL), 1);
  ch_one_line(err);
  assert_non_null(strstr(err, "NOT_FOUND"));
  assert_int_equal(RUN("get", "--region", "3,0:2,6", url, "matrix", NULL), 1);
  ch_one_line(err);
  assert_non_null(strstr(err, "INVALID_REGION"));
  fd = tl_raw_dead_port(&p);
  assert_true(fd >= 0);
  snprintf(dead, sizeof dead, "hurray://127.0.0.1:%d", p);
  assert_int_equal(RUN("get", dead, "x", NULL), 1);
  close(fd);
  ch_one_line(err);
  assert_non_null(strstr(err, "refused"));
  assert_int_equal(RUN("get", "http://x:1", "x", NULL), 1);
  ch_one_line(err);
  /* Usage errors: exit 2, one line. */
  assert_int_equal(RUN("get", url, NULL), 2);
  ch_one_line(err);
  assert_int_equal(RUN("get", "--layout", "diagonal", url, "x", NULL), 2);
  ch_one_line(err);
  assert_int_equal(RUN("frobnicate", NULL), 2);
  /* TLS needs the key too (tests/tls covers the rest). */
  assert_int_equal(RUN("serve", "--tls-cert", "c.pem", ".", NULL), 2);
  ch_one_line(err);
  assert_non_null(strstr(err, "--tls-key"));
  assert_int_equal(RUN("serve", "--auth-token-file", tpath("no-tokens"), ".",
                       NULL),
                   1);
  ch_one_line(err);
  assert_non_null(strstr(err, "token file"));
  assert_int_equal(RUN("put", url, "k", tpath("missing.npy"), NULL), 1);
  ch_one_line(err);
}

static void test_dump_and_inspect(void **state) {
  FILE *f;
  uint8_t buf[4096];
  size_t n;
  hr_msg m;
  int64_t len;

  (void)state;
  assert_int_equal(
      RUN("get", "--dump-wire", tpath("wire.bin"), url, "matrix", NULL), 0);
  assert_int_equal(RUN("inspect", tpath("wire.bin"), NULL), 0);
  assert_non_null(strstr(out, "SERVER_HELLO"));
  assert_non_null(strstr(out, "TENSOR_DESCRIPTOR"));
  assert_non_null(strstr(out, "sync_mode=SYNC_PRODUCER_SYNCED"));
  assert_non_null(strstr(out, "TENSOR_DATA_END"));
  assert_non_null(strstr(out, "shape: [4, 6]"));
  /* Spoil the descriptor's layout tag: the error code and the byte. */
  f = fopen(tpath("wire.bin"), "rb");
  n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  {
    hr_msg_header h;
    size_t first;
    hr_wire_parse_header(buf, &h);
    first = HR_HEADER_SIZE + h.payload_length;
    buf[first + HR_HEADER_SIZE + 4] = 0x40; /* layout tag */
    f = fopen(tpath("bad.bin"), "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
    assert_int_equal(RUN("inspect", tpath("bad.bin"), NULL), 1);
    ch_one_line(err);
    assert_non_null(strstr(err, "INVALID_DESCRIPTOR"));
    {
      char at[32];
      snprintf(at, sizeof at, "byte %zu", first + HR_HEADER_SIZE + 4);
      assert_non_null(strstr(err, at));
    }
  }
  /* One message of any type. */
  tl_hello(&m, 0);
  len = hr_wire_encode(&m, buf, sizeof buf);
  f = fopen(tpath("hello.bin"), "wb");
  fwrite(buf, 1, (size_t)len, f);
  fclose(f);
  assert_int_equal(RUN("inspect", tpath("hello.bin"), NULL), 0);
  assert_non_null(strstr(out, "CLIENT_HELLO"));
  assert_non_null(strstr(out, "1 message,"));
  /* A bad type. */
  hr_wire_put_header(buf, 0x13, 1, 0);
  f = fopen(tpath("type.bin"), "wb");
  fwrite(buf, 1, HR_HEADER_SIZE, f);
  fclose(f);
  assert_int_equal(RUN("inspect", tpath("type.bin"), NULL), 1);
  assert_non_null(strstr(err, "UNKNOWN_MESSAGE_TYPE"));
}

/* Sends bytes [from, to) of `src` on PUT stream 1 in 32 KiB frames. */
static void put_frames(int fd, const uint8_t *src, uint64_t from,
                       uint64_t to) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA;
  m.hdr.stream_id = 1;
  for (uint64_t off = from; off < to; off += m.u.data.data_len) {
    m.u.data.offset = off;
    m.u.data.data = src + off;
    m.u.data.data_len = (uint32_t)(to - off < 32768 ? to - off : 32768);
    assert_int_equal(tl_raw_send_msg(NULL, fd, &m), 0);
  }
}

/* SIGTERM with a large GET and a half-sent PUT in flight: new
 * connections are refused while they drain, the GET's bytes arrive
 * byte-exact, the PUT completes with its ACK, and the server exits 0. */
static void test_graceful_drain_exact(void **state) {
  uint64_t shape[1] = {16u << 20}, put_n = 1u << 20;
  size_t cap = 5u << 20;
  uint8_t *buf = malloc(cap), *got = calloc(1, shape[0]);
  hr_msg m;
  int p, fd, fd2, st, saw_end = 0, saw_goaway = 0, refused = 0;

  (void)state;
  assert_non_null(buf);
  assert_non_null(got);
  hr_tensor *t = tl_dense(HR_ELEM_UINT8, 1, shape, 7);
  hr_descriptor d = *hr_tensor_descriptor(t);
  assert_int_equal(
      hr_npy_save(tpath("drain2.npy"), &d, hr_tensor_buffer(t, 0), NULL, 0),
      0);
  pid_t pid = start_server(&p, "--allow-put", tpath("drain2.npy"), NULL);
  /* The GET: only its descriptor is read before the signal. */
  fd = tl_raw_connect(p);
  tl_hello(&m, 0);
  assert_int_equal(tl_raw_send_msg(NULL, fd, &m), 0);
  assert_true(tl_raw_expect(NULL, fd, HR_MSG_SERVER_HELLO, 0, buf, cap, &m,
                            TL_WAIT_MS));
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 1;
  m.u.request.key = (const uint8_t *)"drain2";
  m.u.request.key_len = 6;
  m.u.request.max_shards = 1;
  assert_int_equal(tl_raw_send_msg(NULL, fd, &m), 0);
  assert_true(tl_raw_expect(NULL, fd, HR_MSG_TENSOR_DESCRIPTOR, 1, buf, cap, &m,
                            TL_WAIT_MS));
  assert_int_equal(m.u.tensor.xport.total_data_bytes, shape[0]);
  /* The PUT: its descriptor and the first half of its bytes. */
  fd2 = tl_raw_connect(p);
  tl_hello(&m, 0);
  assert_int_equal(tl_raw_send_msg(NULL, fd2, &m), 0);
  assert_true(tl_raw_expect(NULL, fd2, HR_MSG_SERVER_HELLO, 0, buf, cap, &m,
                            TL_WAIT_MS));
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_PUT;
  m.hdr.stream_id = 1;
  m.u.put.key = (const uint8_t *)"fresh";
  m.u.put.key_len = 5;
  hr_descriptor *pd = &m.u.put.desc;
  pd->descriptor_version = 1;
  pd->element_type = HR_ELEM_UINT8;
  pd->rank = 1;
  pd->shape[0] = put_n;
  pd->layout.tag = HR_LAYOUT_ROW_MAJOR;
  pd->buffer_count = 1;
  pd->buffers[0].size_bytes = put_n;
  m.u.put.xport.total_data_bytes = put_n;
  m.u.put.xport.total_shards = 1;
  assert_int_equal(tl_raw_send_msg(NULL, fd2, &m), 0);
  put_frames(fd2, hr_tensor_buffer(t, 0), 0, put_n / 2);

  assert_int_equal(kill(pid, SIGTERM), 0);
  /* New connections are refused while both transfers are still open
   * (once the server has handled the signal: up to TL_WAIT_MS). */
  for (int i = 0; i < TL_WAIT_MS / 10 && !refused; i++) {
    int x = tl_raw_connect(p);
    if (x < 0)
      refused = 1;
    else
      close(x);
    usleep(10000);
  }
  assert_true(refused);
  /* The PUT finishes and is acknowledged. */
  put_frames(fd2, hr_tensor_buffer(t, 0), put_n / 2, put_n);
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_DATA_END;
  m.hdr.stream_id = 1;
  assert_int_equal(tl_raw_send_msg(NULL, fd2, &m), 0);
  assert_true(tl_raw_expect(NULL, fd2, HR_MSG_TENSOR_PUT_ACK, 1, buf, cap, &m,
                            TL_WAIT_MS));
  assert_true(tl_raw_wait_eof(NULL, fd2, TL_WAIT_MS));
  close(fd2);
  /* The GET's bytes, placed by their offsets. */
  for (;;) {
    int64_t n = tl_raw_read_msg(NULL, fd, buf, cap, TL_WAIT_MS);
    if (n == 0)
      break;
    assert_true(n > 0);
    assert_int_equal(hr_wire_decode(buf, (size_t)n, NULL, &m, NULL), 0);
    if (m.hdr.type == HR_MSG_TENSOR_DATA) {
      assert_true(m.u.data.offset + m.u.data.data_len <= shape[0]);
      memcpy(got + m.u.data.offset, m.u.data.data, m.u.data.data_len);
    } else if (m.hdr.type == HR_MSG_TENSOR_DATA_END) {
      saw_end = 1;
    } else if (m.hdr.type == HR_MSG_GOAWAY) {
      saw_goaway = 1;
    }
  }
  close(fd);
  assert_true(saw_end);
  assert_true(saw_goaway);
  assert_memory_equal(got, hr_tensor_buffer(t, 0), shape[0]);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  hr_tensor_unref(t);
  free(buf);
  free(got);
}

/* SIGTERM while a GET is in flight: the GET completes, the server sends
 * GOAWAY, refuses new connections and exits 0. */
static void test_graceful_drain(void **state) {
  hr_descriptor d;
  hr_tensor *t;
  uint64_t shape[1] = {32u << 20}, got = 0, want;
  uint8_t buf[70000];
  hr_msg m;
  pid_t pid;
  int p, fd, st, saw_end = 0, saw_goaway = 0;

  (void)state;
  t = tl_dense(HR_ELEM_UINT8, 1, shape, 5);
  d = *hr_tensor_descriptor(t);
  assert_int_equal(
      hr_npy_save(tpath("drain.npy"), &d, hr_tensor_buffer(t, 0), NULL, 0), 0);
  hr_tensor_unref(t);
  pid = start_server(&p, tpath("drain.npy"), NULL, NULL);
  fd = tl_raw_connect(p);
  tl_hello(&m, 0);
  assert_int_equal(tl_raw_send_msg(NULL, fd, &m), 0);
  assert_true(tl_raw_expect(NULL, fd, HR_MSG_SERVER_HELLO, 0, buf, sizeof buf,
                            &m, TL_WAIT_MS));
  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_TENSOR_REQUEST;
  m.hdr.stream_id = 1;
  m.u.request.key = (const uint8_t *)"drain";
  m.u.request.key_len = 5;
  m.u.request.max_shards = 1;
  assert_int_equal(tl_raw_send_msg(NULL, fd, &m), 0);
  assert_true(tl_raw_expect(NULL, fd, HR_MSG_TENSOR_DESCRIPTOR, 1, buf,
                            sizeof buf, &m, TL_WAIT_MS));
  want = m.u.tensor.xport.total_data_bytes;
  /* The transfer is under way (we have not read its data): drain. */
  assert_int_equal(kill(pid, SIGTERM), 0);
  for (;;) {
    hr_msg_header h;
    int64_t n = tl_raw_read_msg(NULL, fd, buf, sizeof buf, TL_WAIT_MS);
    if (n == 0)
      break;
    assert_true(n == -2 || n > 0);
    hr_wire_parse_header(buf, &h);
    if (h.type == HR_MSG_TENSOR_DATA)
      got += h.payload_length - HR_DATA_SUBHEADER_SIZE;
    else if (h.type == HR_MSG_TENSOR_DATA_END)
      saw_end = 1;
    else if (h.type == HR_MSG_GOAWAY)
      saw_goaway = 1;
  }
  close(fd);
  assert_int_equal(got, want);
  assert_true(saw_end);
  assert_true(saw_goaway);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  /* It is gone: nobody listens any more. */
  assert_true(tl_raw_connect(p) < 0);
}

/* `serve --unix PATH` alone: the only listener is the socket; get and ls
 * take unix:PATH URLs; SIGTERM removes the socket file.  With --shm-arena
 * a small PUT (heap memory) is served over SHM from the arena. */
static void test_unix_socket(void **state) {
  const char *sock = tpath("s.sock");
  const char *argv[] = {HURRAY_BIN, "serve", "--unix", sock, "--allow-put",
                        "--shm-arena", "16M",
                        HR_SOURCE_DIR "/examples/data", NULL};
  hr_tensor *ref = load(HR_SOURCE_DIR "/examples/data/matrix.npy"), *got;
  char uurl[300], sock_copy[256], line[512];
  int fd;
  pid_t pid;

  (void)state;
  snprintf(sock_copy, sizeof sock_copy, "%s", sock);
  snprintf(uurl, sizeof uurl, "unix:%s", sock_copy);
  pid = ch_spawn_piped(argv, tpath("userver.log"), &fd);
  ch_read_line(fd, line, sizeof line);
  close(fd);
  /* No TCP listener: the first line is the socket's. */
  assert_int_equal(strncmp(line, "listening on unix:", 18), 0);
  assert_string_equal(line + 18, sock_copy);

  assert_int_equal(RUN("get", "-o", tpath("u.npy"), uurl, "matrix", NULL), 0);
  got = load(tpath("u.npy"));
  assert_true(tl_same_elements(ref, NULL, got));
  hr_tensor_unref(got);
  assert_int_equal(RUN("ls", uurl, NULL), 0);
  assert_non_null(strstr(out, "matrix"));
  /* The served file itself crosses over the SHM plane; --no-shm asks for
   * frames. */
  {
    cJSON *j;
    assert_int_equal(RUN("get", "--stats", "-o", tpath("v.npy"), uurl,
                         "matrix", NULL),
                     0);
    j = stats_of(err);
    assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                        "shm");
    cJSON_Delete(j);
    got = load(tpath("v.npy"));
    assert_true(tl_same_elements(ref, NULL, got));
    hr_tensor_unref(got);
    assert_int_equal(RUN("get", "--stats", "--no-shm", uurl, "matrix", NULL),
                     0);
    j = stats_of(err);
    assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                        "frames");
    cJSON_Delete(j);
    /* A PUT under 1 MiB lands in heap memory; the store copies it into
     * the arena, so it goes over SHM. */
    assert_int_equal(RUN("put", uurl, "p",
                         HR_SOURCE_DIR "/examples/data/matrix.npy", NULL),
                     0);
    assert_int_equal(RUN("get", "--stats", "-o", tpath("w.npy"), uurl, "p",
                         NULL),
                     0);
    j = stats_of(err);
    assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                        "shm");
    cJSON_Delete(j);
    got = load(tpath("w.npy"));
    assert_true(tl_same_elements(ref, NULL, got));
    hr_tensor_unref(got);
  }
  /* The arena's size is a byte count of at least 1 MiB. */
  assert_int_equal(RUN("serve", "--unix", tpath("t.sock"), "--shm-arena",
                       "4K", HR_SOURCE_DIR "/examples/data", NULL),
                   2);
  /* A second server on the live path fails and leaves it alone. */
  assert_int_equal(RUN("serve", "--unix", sock_copy,
                       HR_SOURCE_DIR "/examples/data", NULL),
                   1);
  ch_one_line(err);

  assert_int_equal(ch_stop(pid), 0);
  assert_int_equal(access(sock_copy, F_OK), -1);
  hr_tensor_unref(ref);
}

#ifdef HR_TEST_FABRIC
#include <hurray/fabric.h>

/* serve --fabric and get --fabric --stats: the bytes come over the RDMA
 * data plane and --stats says so; a get without --fabric gets frames. */
static void test_fabric(void **state) {
  hr_fabric *f = NULL;
  hr_fabric_config fc;
  (void)state;
  hr_fabric_config_default(&fc);
  fc.provider = "tcp;ofi_rxm";
  fc.node = "127.0.0.1";
  if (hr_fabric_new(&f, &fc, NULL, NULL, 0) != 0)
    skip(); /* libfabric lacks the provider here */
  hr_fabric_del(f);
  uint64_t shape[2] = {64, 1024};
  hr_tensor *ref = tl_dense(HR_ELEM_FLOAT32, 2, shape, 3), *got;
  char dir[300], file[340], furl[64];
  snprintf(dir, sizeof dir, "%s", tpath("fab"));
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(file, sizeof file, "%s/big.npy", dir);
  assert_int_equal(hr_npy_save(file, hr_tensor_descriptor(ref),
                               hr_tensor_buffer(ref, 0), NULL, 0),
                   0);
  int fport;
  pid_t pid = start_server(&fport, "--fabric", "tcp;ofi_rxm", dir);
  snprintf(furl, sizeof furl, "127.0.0.1:%d", fport);
  assert_int_equal(RUN("get", "--fabric", "tcp;ofi_rxm", "--stats", "-o",
                       tpath("f.npy"), furl, "big", NULL),
                   0);
  got = load(tpath("f.npy"));
  assert_true(tl_same_elements(ref, NULL, got));
  hr_tensor_unref(got);
  cJSON *j = stats_of(err);
  assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                      "rdma");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "fallback")));
  cJSON_Delete(j);
  assert_int_equal(RUN("get", "--stats", furl, "big", NULL), 0);
  j = stats_of(err);
  assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                      "frames");
  cJSON_Delete(j);
  /* Transcoded output goes over the RDMA plane from a host copy made
   * first (decision 76); a server with --rdma-stage-budget 0 makes none
   * and sends it as frames. */
  char nurl[64];
  int nport;
  pid_t npid = ch_serve(&H,
                        (const char *const[]){"--fabric", "tcp;ofi_rxm",
                                              "--rdma-stage-budget", "0",
                                              "--allow-put", dir, NULL},
                        &nport, NULL);
  snprintf(nurl, sizeof nurl, "127.0.0.1:%d", nport);
  const char *servers[2] = {furl, nurl}, *planes[2] = {"rdma", "frames"};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(RUN("get", "--fabric", "tcp;ofi_rxm", "--layout",
                         "column-major", "--allow-transcode", "--stats", "-o",
                         tpath("fx.npy"), servers[k], "big", NULL),
                     0);
    got = load(tpath("fx.npy"));
    assert_int_equal(hr_tensor_descriptor(got)->layout.tag,
                     HR_LAYOUT_COLUMN_MAJOR);
    assert_true(tl_same_elements(ref, NULL, got));
    hr_tensor_unref(got);
    j = stats_of(err);
    assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                        planes[k]);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "transcoded")));
    cJSON_Delete(j);
  }
  /* A PUT from (simulated) device memory is staged for RDMA too; with
   * --rdma-stage-budget 0 it is staged and framed, and says why. */
  const char *budgets[2] = {"64M", "0"};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(RUN("put", "--replace", "--device", "sim", "--fabric",
                         "tcp;ofi_rxm", "--rdma-stage-budget", budgets[k],
                         "--stats", nurl, "up", file, NULL),
                     0);
    j = stats_of(err);
    assert_string_equal(cJSON_GetObjectItem(j, "data_plane")->valuestring,
                        planes[k]);
    assert_non_null(strstr(cJSON_GetObjectItem(j, "fallback")->valuestring,
                           k ? "staged and framed" : "staged for RDMA"));
    cJSON_Delete(j);
    assert_int_equal(RUN("get", "-o", tpath("fu.npy"), nurl, "up", NULL), 0);
    got = load(tpath("fu.npy"));
    assert_true(tl_same_elements(ref, NULL, got));
    hr_tensor_unref(got);
  }
  assert_int_equal(RUN("put", "--rdma-stage-budget", "lots", nurl, "up",
                       file, NULL),
                   2);
  assert_int_equal(ch_stop(npid), 0);
  /* An unknown provider is one line and exit 1. */
  assert_int_equal(
      RUN("get", "--fabric", "no-such-provider", furl, "big", NULL), 1);
  ch_one_line(err);
  assert_int_equal(ch_stop(pid), 0);
  hr_tensor_unref(ref);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
#ifdef HR_TEST_FABRIC
      cmocka_unit_test(test_fabric),
#endif
      cmocka_unit_test(test_ls),
      cmocka_unit_test(test_get_plain_and_stats),
      cmocka_unit_test(test_get_layouts),
      cmocka_unit_test(test_get_safetensors_bf16),
      cmocka_unit_test(test_put_and_parallel),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_dump_and_inspect),
      cmocka_unit_test(test_graceful_drain),
      cmocka_unit_test(test_graceful_drain_exact),
      cmocka_unit_test(test_unix_socket),
      cmocka_unit_test(test_get_device),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
