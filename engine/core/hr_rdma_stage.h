/*
 * The budget of staged RDMA sources (hr_rdma_stage.c, decision 76): the
 * bytes of host copies in flight, counted in an account that the engine
 * shares among its sessions (hr_settings.rdma_stage_account).  Counted
 * with atomics: a copy is freed on whichever thread drops it last.  The
 * account also keeps a few idle copies' memory for reuse (decision 79).
 */
#ifndef HR_RDMA_STAGE_H
#define HR_RDMA_STAGE_H

#include <stdint.h>

#include <hurray/common.h>

typedef struct hr_stage_account hr_stage_account;

/* A new account (one reference), or NULL without memory. */
hr_stage_account *hr__stage_account_new(const hr_mem *mem);
/* Another reference (any thread); NULL-safe. */
hr_stage_account *hr__stage_account_ref(hr_stage_account *a);
/* Drops one; the last frees it (any thread).  NULL-safe. */
void hr__stage_account_unref(hr_stage_account *a);
/* The bytes counted now (tests, records). */
uint64_t hr__stage_account_used(const hr_stage_account *a);

/* What an account holds (tests, benchmarks): bytes counted in all and of
 * idle regions, idle regions, regions allocated and reused so far. */
typedef struct hr__stage_stats {
  uint64_t used, idle;
  unsigned idle_regions;
  uint64_t made, reused;
} hr__stage_stats;
void hr__stage_account_stats(const hr_stage_account *a, hr__stage_stats *st);

#endif /* HR_RDMA_STAGE_H */
