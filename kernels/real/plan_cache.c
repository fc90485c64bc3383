/*
** plan_cache.c -- the bounded table of host-side plans (plan_cache.h has the
** design). A plain array scanned in full: the tables hold tens of plans, and a
** scan of their hashes costs less than one cuBLASLt descriptor call.
*/
#include "plan_cache.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
  void *plan;               /* NULL: empty */
  uint64_t hash, used;      /* used: the table's clock at the last take or add */
  int out;                  /* out to a caller */
  unsigned char *key;       /* key_size bytes inside the table's key block */
} slot;

struct emk_plan_cache {
  pthread_mutex_t mu;
  size_t cap, key_size, len;
  slot *v;
  unsigned char *keys;
  uint64_t clock;
  emk_plan_free_fn free_plan;
  void *ud;
  emk_plan_cache_stats st;
};

/* FNV-1a over the key's bytes. */
static uint64_t hash_of(const void *key, size_t n) {
  const unsigned char *p = key;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

emk_plan_cache *emk_plan_cache_new(size_t capacity, size_t key_size, emk_plan_free_fn free_plan,
                                   void *ud) {
  if (capacity < 1 || key_size < 1) return NULL;
  emk_plan_cache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->v = calloc(capacity, sizeof *c->v);
  c->keys = calloc(capacity, key_size);
  if (!c->v || !c->keys) {
    free(c->v);
    free(c->keys);
    free(c);
    return NULL;
  }
  for (size_t i = 0; i < capacity; i++) c->v[i].key = c->keys + i * key_size;
  pthread_mutex_init(&c->mu, NULL);
  c->cap = capacity;
  c->key_size = key_size;
  c->free_plan = free_plan;
  c->ud = ud;
  c->st.capacity = capacity;
  return c;
}

void emk_plan_cache_delete(emk_plan_cache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->cap; i++)
    if (c->v[i].plan && c->free_plan) c->free_plan(c->ud, c->v[i].plan);
  pthread_mutex_destroy(&c->mu);
  free(c->v);
  free(c->keys);
  free(c);
}

/* The slot holding key, or NULL; under mu. */
static slot *find(emk_plan_cache *c, const void *key, uint64_t h) {
  for (size_t i = 0; i < c->cap; i++) {
    slot *s = &c->v[i];
    if (s->plan && s->hash == h && !memcmp(s->key, key, c->key_size)) return s;
  }
  return NULL;
}

void *emk_plan_cache_take(emk_plan_cache *c, const void *key) {
  uint64_t h = hash_of(key, c->key_size);
  void *plan = NULL;
  pthread_mutex_lock(&c->mu);
  slot *s = find(c, key, h);
  if (s && !s->out) {
    s->out = 1;
    s->used = ++c->clock;
    plan = s->plan;
    c->st.hits++;
  } else {
    c->st.misses++;
    if (s) c->st.busy++;
  }
  pthread_mutex_unlock(&c->mu);
  return plan;
}

int emk_plan_cache_add(emk_plan_cache *c, const void *key, void *plan) {
  if (!plan) return 0;
  uint64_t h = hash_of(key, c->key_size);
  int kept = 0;
  pthread_mutex_lock(&c->mu);
  if (!find(c, key, h)) {
    /* an empty slot, else the least recently used plan not out */
    slot *s = NULL;
    for (size_t i = 0; i < c->cap && !s; i++)
      if (!c->v[i].plan) s = &c->v[i];
    if (!s) {
      for (size_t i = 0; i < c->cap; i++)
        if (!c->v[i].out && (!s || c->v[i].used < s->used)) s = &c->v[i];
      if (s) {
        if (c->free_plan) c->free_plan(c->ud, s->plan);
        s->plan = NULL;
        c->len--;
        c->st.evictions++;
      }
    }
    if (s) {
      memcpy(s->key, key, c->key_size);
      s->hash = h;
      s->plan = plan;
      s->out = 1;
      s->used = ++c->clock;
      c->len++;
      kept = 1;
    }
  }
  if (!kept) c->st.not_kept++;
  c->st.entries = c->len;
  pthread_mutex_unlock(&c->mu);
  return kept;
}

void emk_plan_cache_give_back(emk_plan_cache *c, void *plan) {
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->cap; i++)
    if (c->v[i].plan == plan) {
      c->v[i].out = 0;
      break;
    }
  pthread_mutex_unlock(&c->mu);
}

void emk_plan_cache_stats_get(emk_plan_cache *c, emk_plan_cache_stats *out) {
  pthread_mutex_lock(&c->mu);
  *out = c->st;
  out->entries = c->len;
  pthread_mutex_unlock(&c->mu);
}
