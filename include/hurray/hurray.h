/*
 * libhurray umbrella header: the codec, tensors, the sans-IO session and
 * the engine.  Needs no libevent, CUDA or libfabric headers; the libevent
 * binding lives in <hurray/hr_event.h>.
 */
#ifndef HURRAY_HURRAY_H
#define HURRAY_HURRAY_H

#include <hurray/common.h>
#include <hurray/wire.h>
#include <hurray/tensor.h>
#include <hurray/session.h>
#include <hurray/engine.h>
#include <hurray/inproc.h>
#include <hurray/shm.h>
#include <hurray/metrics.h>

#endif /* HURRAY_HURRAY_H */
