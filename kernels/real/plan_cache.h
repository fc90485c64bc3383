/*
** plan_cache.h -- a small bounded table of host-side plans for the real runtime:
** cuBLASLt's matmul descriptor, layouts and chosen algorithm per GEMM shape
** (gemm_real.c), cuDNN's descriptor set per convolution geometry (dnn_real.c).
** Pure C, no CUDA header and no GPU, so that its behaviour -- hits, misses,
** eviction, exclusive use -- is tested on every machine (tests/c/test_cuda_real.c).
**
** Why. Building those objects costs more host time than a small GEMM or
** convolution takes on the device (a descriptor, three layouts and a heuristic
** query per cuBLASLt call; five descriptors per cuDNN call), and a training step
** repeats the same few shapes thousands of times. So the first call of a key
** builds its plan and keeps it; later calls of that key cost a lookup.
**
** Keys are plain structs of a fixed size per table, zeroed before they are
** filled (padding included) and compared byte for byte, after a 64-bit hash.
**
** One user at a time. A plan taken from the table is out to that caller until it
** gives it back: cuDNN's descriptor gets the algorithm's math type set before each
** run, and cuBLASLt says nothing about two threads reading one descriptor at once.
** A second caller of a key whose plan is out finds it busy, builds its own, and
** frees it after use (the table keeps the first).
**
** Bounded. At most `capacity` plans: adding to a full table evicts the least
** recently used plan that is not out (freed through the table's free callback);
** when every plan is out the new one is not kept. Closing the table frees every
** plan; none may be out then.
**
** Threads: every call takes the table's mutex; the free callback runs under it
** (it only destroys host objects).
*/
#ifndef EMBER_KERNELS_REAL_PLAN_CACHE_H
#define EMBER_KERNELS_REAL_PLAN_CACHE_H
#include <stddef.h>
#include <stdint.h>

typedef struct emk_plan_cache emk_plan_cache;
typedef void (*emk_plan_free_fn)(void *ud, void *plan);

typedef struct emk_plan_cache_stats {
  uint64_t hits, misses;    /* takes that found the plan, takes that did not */
  uint64_t busy;            /* of the misses: the key's plan was out to another caller */
  uint64_t evictions;       /* plans freed to make room */
  uint64_t not_kept;        /* adds refused: the key already there, or every plan out */
  size_t entries, capacity;
} emk_plan_cache_stats;

/* A table of at most capacity (>= 1) plans under keys of key_size bytes; NULL
** when out of host memory. free_plan(ud, plan) frees an evicted or closed plan. */
emk_plan_cache *emk_plan_cache_new(size_t capacity, size_t key_size, emk_plan_free_fn free_plan,
                                   void *ud);
/* Frees every plan and the table (NULL: nothing). */
void emk_plan_cache_delete(emk_plan_cache *c);
/* The plan of key, now out to the caller (a hit), or NULL (a miss: absent, or out
** to another caller). */
void *emk_plan_cache_take(emk_plan_cache *c, const void *key);
/* Keeps plan under key, out to the caller as after a hit: 1. Or 0: not kept (key
** already has a plan, or every plan is out, or no memory), and the caller frees
** plan after its use. */
int emk_plan_cache_add(emk_plan_cache *c, const void *key, void *plan);
/* Gives back a plan from take or a kept add. */
void emk_plan_cache_give_back(emk_plan_cache *c, void *plan);
void emk_plan_cache_stats_get(emk_plan_cache *c, emk_plan_cache_stats *out);

/* The real runtime's tables, for tests on a GPU: 0 and *out filled, or -1 when rt
** is not the real runtime or has no such table yet (gemm_real.c, dnn_real.c). */
typedef struct emk_runtime emk_runtime;
int emk_real_gemm_plans(emk_runtime *rt, emk_plan_cache_stats *out);
int emk_real_conv_plans(emk_runtime *rt, emk_plan_cache_stats *out);

#endif
