/*
** algo_cache.c -- the convolution algorithms chosen per geometry, one cache per
** state's CUDA context (emk_cuda.algos). Choosing asks the runtime for its list
** (cuDNN's heuristics on a GPU) and is worth doing once per shape; the cache is
** the state's own, as every piece of a state is (DESIGN principle 1): two states
** in one process share nothing, and a state is used by one thread at a time, so
** there is no lock. A full table starts over: a process cycling through more
** shapes than that pays the choice again, nothing worse.
*/
#include "cuda.h"
#include "dnn.h"
#include <stdlib.h>

enum { CACHE_MAX = 4096 };

typedef struct algo_key {
  int dev;
  emk_conv_desc c;
} algo_key;

typedef struct algo_entry {
  algo_key key;
  emk_conv_algo pick;
} algo_entry;

struct emk_algo_cache {
  algo_entry *v;
  size_t len, cap;
  uint64_t hits, misses;
};

emk_algo_cache *emk_algo_cache_new(void) { return calloc(1, sizeof(emk_algo_cache)); }

void emk_algo_cache_free(emk_algo_cache *c) {
  if (!c) return;
  free(c->v);
  free(c);
}

static void key_of(algo_key *k, int dev, const emk_conv_desc *c) {
  memset(k, 0, sizeof *k);        /* padding too: keys are compared with memcmp */
  k->dev = dev;
  k->c.dir = c->dir;
  k->c.dtype = c->dtype;
  k->c.allow_tf32 = c->allow_tf32;
  k->c.N = c->N, k->c.C = c->C, k->c.H = c->H, k->c.W = c->W, k->c.O = c->O;
  k->c.kH = c->kH, k->c.kW = c->kW, k->c.OH = c->OH, k->c.OW = c->OW;
  k->c.sH = c->sH, k->c.sW = c->sW, k->c.pH = c->pH, k->c.pW = c->pW;
  k->c.dH = c->dH, k->c.dW = c->dW, k->c.G = c->G;
  k->c.nhwc = c->nhwc;            /* cuDNN ranks NHWC and NCHW differently */
}

int emk_algo_cache_find(emk_algo_cache *c, int dev, const emk_conv_desc *desc,
                        emk_conv_algo *out) {
  algo_key k;
  key_of(&k, dev, desc);
  for (size_t i = c->len; i-- > 0;)
    if (!memcmp(&c->v[i].key, &k, sizeof k)) {
      *out = c->v[i].pick;
      c->hits++;
      return 1;
    }
  c->misses++;
  return 0;
}

void emk_algo_cache_put(emk_algo_cache *c, int dev, const emk_conv_desc *desc,
                        const emk_conv_algo *pick) {
  if (c->len == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 64;
    if (cap > CACHE_MAX) cap = CACHE_MAX;
    if (c->len == cap) {
      c->len = 0;
    } else {
      algo_entry *v = (algo_entry *)realloc(c->v, cap * sizeof *v);
      if (!v) return;                              /* simply not cached */
      c->v = v;
      c->cap = cap;
    }
  }
  key_of(&c->v[c->len].key, dev, desc);
  c->v[c->len].pick = *pick;
  c->len++;
}

void emk_algo_cache_stats(const emk_algo_cache *c, emk_dnn_cache_stats *out) {
  out->hits = c->hits;
  out->misses = c->misses;
  out->entries = c->len;
}
