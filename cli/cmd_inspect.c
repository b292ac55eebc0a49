/*
 * `hurray inspect FILE`: decodes a raw capture of one direction of a
 * connection (e.g. from `hurray get --dump-wire`) message by message and
 * prints every field.  No order rules are applied, so a file holding any
 * single message works.  At the first message that does not decode it
 * prints the spec's error code name and the byte offset, and exits 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define SYNOPSIS "FILE"

static void print_bytes_str(const uint8_t *s, size_t n) {
  size_t i;

  putchar('"');
  for (i = 0; i < n; i++) {
    uint8_t c = s[i];
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20 || c == 0x7f)
      printf("\\x%02x", c);
    else
      putchar(c);
  }
  putchar('"');
}

static void print_hex(const uint8_t *p, size_t n, size_t max) {
  size_t i;

  for (i = 0; i < n && i < max; i++)
    printf("%02x", p[i]);
  if (n > max)
    printf("... (%zu bytes)", n);
  if (n == 0)
    printf("(empty)");
}

static void print_layout_entry(const hr_layout_entry *e) {
  hr_layout_profile pr;
  unsigned k;

  printf("%s (0x%02x)", hr_layout_name(e->tag), e->tag);
  if (e->tag < HR_LAYOUT_EXT_FIRST || e->tag > HR_LAYOUT_EXT_LAST)
    return;
  printf(" ext_metadata=");
  print_hex(e->ext, e->ext_len, 64);
  if (e->ext_len == 0 && e->tag <= HR_LAYOUT_PERMUTED_EXACT) {
    /* In a HELLO, a profile without metadata means "any parameters". */
    printf(" {any parameters}");
  } else if (hr_layout_profile_parse(e, &pr) == 0) {
    if (pr.tag == HR_LAYOUT_PANEL) {
      printf(" {mr=%u}", pr.mr);
    } else if (pr.tag == HR_LAYOUT_TILED_EXACT) {
      printf(" {tile=[");
      for (k = 0; k < pr.rank; k++)
        printf("%s%u", k ? "," : "", pr.tile[k]);
      printf("]}");
    } else if (pr.tag == HR_LAYOUT_PERMUTED_EXACT) {
      printf(" {order=[");
      for (k = 0; k < pr.rank; k++)
        printf("%s%u", k ? "," : "", pr.order[k]);
      printf("]}");
    }
  } else if (e->tag <= HR_LAYOUT_PERMUTED_EXACT) {
    printf(" {metadata does not parse: not satisfiable}");
  }
}

static void print_u64s(const uint64_t *v, unsigned n) {
  unsigned k;

  putchar('[');
  for (k = 0; k < n; k++)
    printf("%s%llu", k ? ", " : "", (unsigned long long)v[k]);
  putchar(']');
}

static void print_caps(uint32_t caps) {
  static const char *names[] = {"TRANSCODING",     "PARALLEL_STREAMS",
                                "RDMA_DATA_PLANE", "RDMA_GPUDIRECT",
                                "TENSOR_PUT",      "LIST",
                                "SHM_DATA_PLANE",  "REGION_REQUESTS"};
  int k, first = 1;

  printf("0x%08x", caps);
  for (k = 0; k < 32; k++) {
    if (!(caps & (1u << k)))
      continue;
    printf("%s%s", first ? " (" : " | ", k < 8 ? names[k] : "unassigned");
    if (k >= 8)
      printf("-bit%d", k);
    first = 0;
  }
  if (!first)
    putchar(')');
}

static void print_hello(const hr_hello *h) {
  size_t pos = 0;
  hr_ext x;
  unsigned k;

  printf("  magic: 0x%08x\n  version: %u.%u\n  capability_flags: ", h->magic,
         h->version_major, h->version_minor);
  print_caps(h->capability_flags);
  printf("\n  max_message_size: %u\n  supported_layouts (%u):",
         h->max_message_size, h->layout_count);
  for (k = 0; k < h->layout_count && k < HR_MAX_LAYOUTS; k++) {
    printf("\n    ");
    print_layout_entry(&h->layouts[k]);
  }
  printf("\n  supported_devices (%u):", h->device_count);
  for (k = 0; k < h->device_count; k++)
    printf(" %s", hr_device_name(h->devices[k]));
  printf("\n  supported_memory_classes (%u):", h->memory_class_count);
  for (k = 0; k < h->memory_class_count; k++)
    printf(" %s", hr_memory_class_name(h->memory_classes[k]));
  printf("\n  extensions (%u):", h->ext_count);
  while (hr_ext_next(h->ext_raw, h->ext_raw_len, &pos, &x)) {
    printf("\n    type 0x%04x", x.type);
    switch (x.type) {
    case HR_EXT_AUTH_TOKEN: printf(" AUTH_TOKEN: %u bytes", x.length); break;
    case HR_EXT_SESSION_JOIN:
      printf(" SESSION_JOIN: ");
      print_hex(x.data, x.length, 64);
      break;
    case HR_EXT_SESSION_TOKEN:
      printf(" SESSION_TOKEN: ");
      print_hex(x.data, x.length, 64);
      break;
    case HR_EXT_FABRIC_ADDRESS:
      printf(" FABRIC_ADDRESS: ");
      print_hex(x.data, x.length, 64);
      break;
    case HR_EXT_PEER_NAME:
      printf(" PEER_NAME: ");
      print_bytes_str(x.data, x.length);
      break;
    case HR_EXT_MAX_SHARDS:
      printf(" MAX_SHARDS: ");
      if (x.length == 2)
        printf("%u", (unsigned)(x.data[0] | x.data[1] << 8));
      else
        print_hex(x.data, x.length, 16);
      break;
    default:
      printf(" (unknown, ignored): ");
      print_hex(x.data, x.length, 32);
      break;
    }
  }
  putchar('\n');
}

static void print_params(const hr_descriptor *d) {
  const hr_layout_params *p = &d->params;
  unsigned k;

  switch (d->layout.tag) {
  case HR_LAYOUT_STRIDED:
    printf("origin=%llu strides=[", (unsigned long long)p->origin);
    for (k = 0; k < d->rank; k++)
      printf("%s%lld", k ? ", " : "", (long long)p->strides[k]);
    putchar(']');
    break;
  case HR_LAYOUT_PERMUTED:
    printf("order=[");
    for (k = 0; k < d->rank; k++)
      printf("%s%u", k ? ", " : "", p->order[k]);
    putchar(']');
    break;
  case HR_LAYOUT_TILED:
    printf("tile=[");
    for (k = 0; k < d->rank; k++)
      printf("%s%u", k ? ", " : "", p->tile[k]);
    putchar(']');
    break;
  case HR_LAYOUT_SPARSE_COO:
    printf("nnz=%llu index_type=%s sorted=%u", (unsigned long long)p->nnz,
           hr_elem_type_name(p->index_type), p->sorted);
    break;
  case HR_LAYOUT_SPARSE_CSR:
  case HR_LAYOUT_SPARSE_CSC:
    printf("nnz=%llu index_type=%s", (unsigned long long)p->nnz,
           hr_elem_type_name(p->index_type));
    break;
  case HR_LAYOUT_SPARSE_BSR:
    printf("br=%u bc=%u nnz_blocks=%llu index_type=%s", p->br, p->bc,
           (unsigned long long)p->nnz, hr_elem_type_name(p->index_type));
    break;
  case HR_LAYOUT_COMPOSITE:
    printf("member_count=%u rule=%s", p->member_count,
           p->rule == HR_COMPOSITE_TUPLE             ? "TUPLE"
           : p->rule == HR_COMPOSITE_CONCAT          ? "CONCAT"
           : p->rule == HR_COMPOSITE_GROUP_QUANTIZED ? "GROUP_QUANTIZED"
                                                     : "UNKNOWN");
    if (p->rule == HR_COMPOSITE_CONCAT)
      printf(" axis=%u", p->axis);
    if (p->rule == HR_COMPOSITE_GROUP_QUANTIZED)
      printf(" axis=%u group_size=%u has_zero_point=%u", p->axis, p->group_size,
             p->has_zero_point);
    break;
  default:
    if (d->params_len) {
      printf("raw=");
      print_hex(d->params_raw, d->params_len, 64);
    } else {
      printf("(none)");
    }
    break;
  }
}

static void print_desc(const hr_descriptor *d) {
  unsigned k;

  printf("  descriptor_version: %u\n  element_type: %s (0x%02x)\n  rank: %u\n"
         "  flags: 0x%02x%s\n  layout: ",
         d->descriptor_version, hr_elem_type_name(d->element_type),
         d->element_type, d->rank, d->flags,
         (d->flags & HR_DESC_HAS_SHARD) ? " (HAS_SHARD)" : "");
  print_layout_entry(&d->layout);
  printf("\n  shape: ");
  print_u64s(d->shape, d->rank);
  printf("\n  layout_params (%u bytes): ", d->params_len);
  print_params(d);
  printf("\n  byte_offset: %llu\n", (unsigned long long)d->byte_offset);
  if (d->flags & HR_DESC_HAS_SHARD) {
    printf("  parent_shape: ");
    print_u64s(d->parent_shape, d->rank);
    printf("\n  shard_offset: ");
    print_u64s(d->shard_offset, d->rank);
    putchar('\n');
  }
  printf("  buffers (%u):\n", d->buffer_count);
  for (k = 0; k < d->buffer_count && k < HR_MAX_BUFFERS; k++) {
    const hr_buffer_handle *b = &d->buffers[k];
    printf("    [%u] size_bytes=%llu alignment_log2=%u device=%s "
           "memory_class=%s device_index=%u sync_mode=%s (0x%02x)\n",
           k, (unsigned long long)b->size_bytes, b->alignment_log2,
           hr_device_name(b->device_tag), hr_memory_class_name(b->memory_class),
           b->device_index, hr_sync_mode_name(b->sync_mode), b->sync_mode);
  }
}

static void print_xport(const hr_transport_fields *x) {
  printf("  total_data_bytes: %llu\n  shard_index: %u\n  total_shards: %u\n"
         "  data_plane: %s\n",
         (unsigned long long)x->total_data_bytes, x->shard_index,
         x->total_shards,
         x->data_plane == HR_PLANE_FRAMES ? "FRAMES"
         : x->data_plane == HR_PLANE_RDMA ? "RDMA"
         : x->data_plane == HR_PLANE_SHM  ? "SHM"
                                          : "UNKNOWN");
}

static void print_request(const hr_request *r) {
  unsigned k;

  printf("  tensor_key: ");
  print_bytes_str(r->key, r->key_len);
  printf("\n  request_flags: 0x%08x", r->flags);
  if (r->flags)
    printf(" (%s%s%s)",
           (r->flags & HR_REQ_ALLOW_TRANSCODE) ? "ALLOW_TRANSCODE " : "",
           (r->flags & HR_REQ_PARALLEL_OK) ? "PARALLEL_OK " : "",
           (r->flags & HR_REQ_REGION) ? "REGION" : "");
  printf("\n  preferred_layouts (%u):", r->layout_count);
  for (k = 0; k < r->layout_count && k < HR_MAX_LAYOUTS; k++) {
    printf("\n    ");
    print_layout_entry(&r->layouts[k]);
  }
  printf("\n  preferred_device: %s\n  min_alignment_log2: %u\n"
         "  max_shards: %u\n",
         hr_device_name(r->preferred_device), r->min_alignment_log2,
         r->max_shards);
  if (r->flags & HR_REQ_REGION) {
    printf("  region_rank: %u\n  region_offset: ", r->region_rank);
    print_u64s(r->region_offset, r->region_rank);
    printf("\n  region_shape: ");
    print_u64s(r->region_shape, r->region_rank);
    putchar('\n');
  }
}

static void print_msg(const hr_msg *m) {
  size_t pos = 0;
  hr_list_entry e;

  switch (m->hdr.type) {
  case HR_MSG_CLIENT_HELLO:
  case HR_MSG_SERVER_HELLO: print_hello(&m->u.hello); break;
  case HR_MSG_TENSOR_REQUEST: print_request(&m->u.request); break;
  case HR_MSG_TENSOR_DESCRIPTOR:
    print_desc(&m->u.tensor.desc);
    print_xport(&m->u.tensor.xport);
    break;
  case HR_MSG_TENSOR_DATA:
    printf("  buffer_index: %u\n  byte_offset_in_buffer: %llu\n"
           "  data: %u bytes: ",
           m->u.data.buffer_index, (unsigned long long)m->u.data.offset,
           m->u.data.data_len);
    print_hex(m->u.data.data, m->u.data.data_len, 16);
    putchar('\n');
    break;
  case HR_MSG_TENSOR_PUT:
    printf("  tensor_key: ");
    print_bytes_str(m->u.put.key, m->u.put.key_len);
    printf("\n  put_flags: 0x%08x%s\n", m->u.put.flags,
           (m->u.put.flags & HR_PUT_REPLACE) ? " (REPLACE)" : "");
    print_desc(&m->u.put.desc);
    print_xport(&m->u.put.xport);
    break;
  case HR_MSG_ERROR:
    printf("  error_code: %s (0x%04x)\n  message: ",
           hr_wire_error_name(m->u.error.code), m->u.error.code);
    print_bytes_str(m->u.error.message, m->u.error.message_len);
    putchar('\n');
    break;
  case HR_MSG_GOAWAY:
    printf("  last_stream_id: %u\n  error_code: %s (0x%04x)\n  message: ",
           m->u.goaway.last_stream_id, hr_wire_error_name(m->u.goaway.code),
           m->u.goaway.code);
    print_bytes_str(m->u.goaway.message, m->u.goaway.message_len);
    putchar('\n');
    break;
  case HR_MSG_RDMA_REGISTER:
    printf("  role: %s\n  length: %llu\n  address: 0x%llx\n  key: 0x%llx\n"
           "  raw_key: ",
           m->u.rdma.role == HR_RDMA_SOURCE ? "SOURCE" : "DESTINATION",
           (unsigned long long)m->u.rdma.length,
           (unsigned long long)m->u.rdma.address,
           (unsigned long long)m->u.rdma.key);
    print_hex(m->u.rdma.raw_key, m->u.rdma.raw_key_len, 64);
    putchar('\n');
    break;
  case HR_MSG_PING:
  case HR_MSG_PONG:
    printf("  opaque: 0x%016llx\n", (unsigned long long)m->u.ping);
    break;
  case HR_MSG_LIST_REQUEST:
    printf("  prefix: ");
    print_bytes_str(m->u.list_request.prefix, m->u.list_request.prefix_len);
    printf("\n  start_after: ");
    print_bytes_str(m->u.list_request.start_after,
                    m->u.list_request.start_after_len);
    printf("\n  max_entries: %u\n", m->u.list_request.max_entries);
    break;
  case HR_MSG_LIST_RESPONSE:
    printf("  more: %u\n  entries (%u):\n", m->u.list_response.more,
           m->u.list_response.entry_count);
    while (hr_list_entry_next(m->u.list_response.entries_raw,
                              m->u.list_response.entries_raw_len, &pos, &e)) {
      printf("    ");
      print_bytes_str(e.key, e.key_len);
      printf(" %s %s ", hr_elem_type_name(e.element_type),
             hr_layout_name(e.layout_tag));
      print_u64s(e.shape, e.rank);
      printf(" %llu bytes\n", (unsigned long long)e.total_data_bytes);
    }
    break;
  default:
    /* Empty payloads: DATA_END, PUT_ACK, CANCEL, RDMA_READY,
     * BUFFER_RELEASE. */
    break;
  }
}

int cli_inspect(int argc, char **argv) {
  const char *path;
  struct stat st;
  const uint8_t *data = NULL;
  uint64_t size, off = 0, count = 0;
  int fd;

  if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    printf("usage: hurray inspect " SYNOPSIS "\n");
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-')
    return cli_usage("inspect", SYNOPSIS, "expected exactly one FILE");
  path = argv[1];
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st) != 0) {
    cli_err("inspect", "cannot open %s: %s (check the path)", path,
            strerror(errno));
    if (fd >= 0)
      close(fd);
    return CLI_EXIT_FAIL;
  }
  size = (uint64_t)st.st_size;
  if (size) {
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      cli_err("inspect", "cannot map %s: %s", path, strerror(errno));
      close(fd);
      return CLI_EXIT_FAIL;
    }
    data = p;
  }
  close(fd);
  while (off < size) {
    hr_msg_header h;
    hr_wire_status ws;
    hr_msg m;
    uint64_t left = size - off;

    if (left < HR_HEADER_SIZE) {
      printf("@%llu: %llu trailing bytes, not a whole header\n",
             (unsigned long long)off, (unsigned long long)left);
      cli_err("inspect",
              "%s is truncated at byte %llu (a capture cut inside a header)",
              path, (unsigned long long)off);
      return CLI_EXIT_FAIL;
    }
    hr_wire_parse_header(data + off, &h);
    printf("@%llu %s (0x%x) stream=%u payload_length=%u\n",
           (unsigned long long)off, hr_msg_type_name(h.type), h.type,
           h.stream_id, h.payload_length);
    memset(&ws, 0, sizeof ws);
    if (hr_wire_check_header(&h, UINT32_MAX, NULL, &ws) != 0) {
      printf("  INVALID: %s at byte %llu: %s\n", hr_wire_error_name(ws.code),
             (unsigned long long)(off + ws.offset), ws.reason);
      cli_err("inspect", "message %llu is invalid: %s at byte %llu: %s",
              (unsigned long long)count, hr_wire_error_name(ws.code),
              (unsigned long long)(off + ws.offset), ws.reason);
      return CLI_EXIT_FAIL;
    }
    if (h.payload_length > left - HR_HEADER_SIZE) {
      printf("  truncated: the payload needs %u bytes, %llu remain\n",
             h.payload_length, (unsigned long long)(left - HR_HEADER_SIZE));
      cli_err("inspect",
              "%s is truncated inside message %llu at byte %llu (a capture "
              "cut short)",
              path, (unsigned long long)count, (unsigned long long)off);
      return CLI_EXIT_FAIL;
    }
    if (hr_wire_decode(data + off, HR_HEADER_SIZE + h.payload_length, NULL, &m,
                       &ws) != 0) {
      printf("  INVALID: %s at byte %llu: %s\n", hr_wire_error_name(ws.code),
             (unsigned long long)(off + ws.offset), ws.reason);
      cli_err("inspect", "message %llu is invalid: %s at byte %llu: %s",
              (unsigned long long)count, hr_wire_error_name(ws.code),
              (unsigned long long)(off + ws.offset), ws.reason);
      return CLI_EXIT_FAIL;
    }
    print_msg(&m);
    off += HR_HEADER_SIZE + (uint64_t)h.payload_length;
    count++;
  }
  printf("%llu message%s, %llu bytes\n", (unsigned long long)count,
         count == 1 ? "" : "s", (unsigned long long)size);
  return 0;
}
