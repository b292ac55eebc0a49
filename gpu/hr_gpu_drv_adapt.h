/*
 * The adaptors of hr__gpu_drv_ops (hr_gpu_drv.h) for a driver whose
 * stream and event entry points mirror CUDA's call for call: written once,
 * included by the cuda and hip backends.  Not a header in the usual sense:
 * it defines static functions and `drv_ops`, once per including file.
 *
 * The including file defines, before including it:
 *   DRV_DEV                 its device type, whose member `f` holds the
 *                           entry points StreamCreate, StreamDestroy,
 *                           StreamSynchronize, EventCreate, EventDestroy,
 *                           EventRecord, StreamWaitEvent, EventQuery,
 *                           EventSynchronize, IpcGetEventHandle and
 *                           IpcOpenEventHandle (CUDA's signatures, with the
 *                           driver's types);
 *   DRV_STREAM, DRV_EVENT   the driver's stream and event handle types;
 *   DRV_IPC_EVENT           its IPC event handle type;
 *   DRV_STREAM_NONBLOCKING  the flag of a non-blocking stream;
 *   DRV_EVENT_NO_TIMING, DRV_EVENT_IPC  the flags of an event without
 *                           timing and of an exportable one;
 * and the functions `int map_err(<driver error>)` and `int cur(DRV_DEV *)`
 * (makes the device current).
 */
#ifndef DRV_DEV
#error "define DRV_DEV and the other DRV_* names before including"
#endif

static int drv_make_current(void *dev) { return cur(dev); }

static int drv_stream_create(void *dev, void **s) {
  DRV_STREAM h = NULL;
  int rv =
      map_err(((DRV_DEV *)dev)->f.StreamCreate(&h, DRV_STREAM_NONBLOCKING));
  *s = h;
  return rv;
}

static void drv_stream_destroy(void *dev, void *s) {
  ((DRV_DEV *)dev)->f.StreamDestroy(s);
}

static int drv_stream_sync(void *dev, void *s) {
  return map_err(((DRV_DEV *)dev)->f.StreamSynchronize(s));
}

static int drv_event_create(void *dev, int ipc, void **e) {
  DRV_EVENT h = NULL;
  unsigned f = DRV_EVENT_NO_TIMING;
  if (ipc)
    f |= DRV_EVENT_IPC;
  int rv = map_err(((DRV_DEV *)dev)->f.EventCreate(&h, f));
  *e = h;
  return rv;
}

static void drv_event_destroy(void *dev, void *e) {
  ((DRV_DEV *)dev)->f.EventDestroy(e);
}

static int drv_event_record(void *dev, void *e, void *s) {
  return map_err(((DRV_DEV *)dev)->f.EventRecord(e, s));
}

static int drv_stream_wait_event(void *dev, void *s, void *e) {
  return map_err(((DRV_DEV *)dev)->f.StreamWaitEvent(s, e, 0));
}

static int drv_event_query(void *dev, void *e) {
  return map_err(((DRV_DEV *)dev)->f.EventQuery(e));
}

static int drv_event_sync(void *dev, void *e) {
  return map_err(((DRV_DEV *)dev)->f.EventSynchronize(e));
}

static int drv_ipc_event_get(void *dev, void *e, hr_gpu_ipc_handle *h) {
  DRV_IPC_EVENT ih;
  int rv = map_err(((DRV_DEV *)dev)->f.IpcGetEventHandle(&ih, e));
  if (rv == 0)
    memcpy(h->bytes, &ih, sizeof ih);
  return rv;
}

static int drv_ipc_event_open(void *dev, const hr_gpu_ipc_handle *h, void **e) {
  DRV_IPC_EVENT ih;
  DRV_EVENT he = NULL;
  memcpy(&ih, h->bytes, sizeof ih);
  int rv = map_err(((DRV_DEV *)dev)->f.IpcOpenEventHandle(&he, ih));
  *e = he;
  return rv;
}

static const hr__gpu_drv_ops drv_ops = {
    .make_current = drv_make_current,
    .stream_create = drv_stream_create,
    .stream_destroy = drv_stream_destroy,
    .stream_sync = drv_stream_sync,
    .event_create = drv_event_create,
    .event_destroy = drv_event_destroy,
    .event_record = drv_event_record,
    .stream_wait_event = drv_stream_wait_event,
    .event_query = drv_event_query,
    .event_sync = drv_event_sync,
    .ipc_event_get = drv_ipc_event_get,
    .ipc_event_open = drv_ipc_event_open,
};
