/*
 * An extension of the engine that lives in a layer above it (the
 * in-process pair, engine/inproc/): the engine runs it on every wakeup,
 * asks it before it frees itself, and detaches it then.  The engine knows
 * nothing else about it.
 */
#ifndef HR_ENGINE_EXT_H
#define HR_ENGINE_EXT_H

#include <hurray/engine.h>

typedef struct hr__engine_ext hr__engine_ext;
struct hr__engine_ext {
  /* On the loop thread, inside the engine's wakeup handling (after the
   * pool's completions, before config.on_wakeup); the engine settles
   * afterwards, so sessions touched here are flushed. */
  void (*run)(hr__engine_ext *x);
  /* Non-zero: hr_engine_del() answers HR_ERR_BUSY. */
  int (*busy)(hr__engine_ext *x);
  /* hr_engine_del() is freeing the engine: forget it (any thread may
   * still hold the extension). */
  void (*detach)(hr__engine_ext *x);
};

/* The engine's one extension slot (NULL until set).  Loop thread. */
hr__engine_ext **hr__engine_ext_slot(hr_engine *e);

#endif /* HR_ENGINE_EXT_H */
