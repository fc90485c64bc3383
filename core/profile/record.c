/*
** record.c -- the profiler's event buffers: starting and stopping, one buffer
** (one track) per recording thread, the recording calls the rest of core/ makes,
** and the public em_profile_* accessors. The model is in profile.h.
**
** A profile lives in S->profiler while recording and moves to S->profile_last
** at stop, where its events are merged into one array sorted by start time and
** kept until the next start or em_close.
*/
#include "profile.h"
#include <stdio.h>
#include <stdlib.h>

enum { CHUNK_EVENTS = 4096, MAX_CHUNKS = 4096, MAX_RANGE_DEPTH = 32, MAX_TRACKS = 512 };

typedef struct prof_buf {
  struct prof_buf *next;
  pthread_t owner;
  int track;
  int64_t count;                         /* published events (atomic) */
  int64_t dropped;
  em_profile_event *chunks[MAX_CHUNKS];
  int depth;                             /* open ranges of this thread */
  struct { double t0; const char *name; int kind; } ranges[MAX_RANGE_DEPTH];
} prof_buf;

typedef struct interned { struct interned *next; char s[]; } interned;

typedef struct emi_profiler {
  em_state *S;
  uint64_t id;                /* unique: thread caches compare it, never the pointer */
  pthread_mutex_t mu;         /* bufs, tracks, strings */
  pthread_t main_thread;
  prof_buf *bufs;
  int ntracks;
  char *tracks[MAX_TRACKS];
  interned *strings;
  double origin;
  int auto_step, explicit_steps;
  int64_t saved_peak, peak;
  /* after stop */
  em_profile_event *merged;
  int64_t nmerged, dropped;
} emi_profiler;

static uint64_t next_profiler_id = 1;

static __thread struct { uint64_t id; prof_buf *buf; } tl_cache;
static __thread const char *tl_label;
static __thread int tl_index;

void emi_profile_thread_label(const char *label, int index) {
  tl_label = label;
  tl_index = index;
}

/* -- Buffers ------------------------------------------------------------------------- */

static char *dup_str(em_state *S, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = emi_malloc(S, n);
  if (d) memcpy(d, s, n);
  return d;
}

/* The calling thread's buffer, made (with its track) on first use. NULL when out of
** memory or out of tracks: the event is then lost. */
static prof_buf *thread_buf(emi_profiler *p) {
  if (tl_cache.id == p->id) return tl_cache.buf;
  pthread_t self = pthread_self();
  pthread_mutex_lock(&p->mu);
  prof_buf *b = p->bufs;
  while (b && !pthread_equal(b->owner, self)) b = b->next;
  if (!b && p->ntracks < MAX_TRACKS && (b = emi_malloc(p->S, sizeof *b))) {
    memset(b, 0, sizeof *b);
    b->owner = self;
    char name[64];
    if (pthread_equal(self, p->main_thread)) snprintf(name, sizeof name, "main");
    else if (tl_label && tl_index > 0) snprintf(name, sizeof name, "%s %d", tl_label, tl_index);
    else if (tl_label) snprintf(name, sizeof name, "%s", tl_label);
    else snprintf(name, sizeof name, "thread %d", p->ntracks);
    char *tn = dup_str(p->S, name);
    if (!tn) { emi_free(p->S, b, sizeof *b); b = NULL; }
    else {
      b->track = p->ntracks;
      p->tracks[p->ntracks++] = tn;
      b->next = p->bufs;
      p->bufs = b;
    }
  }
  pthread_mutex_unlock(&p->mu);
  if (b) { tl_cache.id = p->id; tl_cache.buf = b; }
  return b;
}

static void buf_append(emi_profiler *p, prof_buf *b, const em_profile_event *ev) {
  int64_t n = b->count;                 /* only this thread writes count */
  int64_t c = n / CHUNK_EVENTS;
  if (c >= MAX_CHUNKS ||
      (!b->chunks[c] &&
       !(b->chunks[c] = emi_malloc(p->S, sizeof(em_profile_event) * CHUNK_EVENTS)))) {
    __atomic_add_fetch(&b->dropped, 1, __ATOMIC_RELAXED);
    return;
  }
  em_profile_event *e = &b->chunks[c][n % CHUNK_EVENTS];
  *e = *ev;
  e->track = b->track;
  __atomic_store_n(&b->count, n + 1, __ATOMIC_RELEASE);
}

void emi_profile_record(emi_profiler *p, const em_profile_event *ev) {
  prof_buf *b = thread_buf(p);
  if (b) buf_append(p, b, ev);
}

const char *emi_profile_intern(emi_profiler *p, const char *name) {
  if (!name) name = "?";
  pthread_mutex_lock(&p->mu);
  interned *i = p->strings;
  while (i && strcmp(i->s, name) != 0) i = i->next;
  if (!i) {
    size_t n = strlen(name) + 1;
    if ((i = emi_malloc(p->S, sizeof *i + n))) {
      memcpy(i->s, name, n);
      i->next = p->strings;
      p->strings = i;
    }
  }
  pthread_mutex_unlock(&p->mu);
  return i ? i->s : "?";
}

static void profiler_free(emi_profiler *p) {
  if (!p) return;
  em_state *S = p->S;
  for (prof_buf *b = p->bufs, *nb; b; b = nb) {
    nb = b->next;
    for (int c = 0; c < MAX_CHUNKS && b->chunks[c]; c++)
      emi_free(S, b->chunks[c], sizeof(em_profile_event) * CHUNK_EVENTS);
    emi_free(S, b, sizeof *b);
  }
  for (int t = 0; t < p->ntracks; t++) emi_free(S, p->tracks[t], strlen(p->tracks[t]) + 1);
  for (interned *i = p->strings, *ni; i; i = ni) {
    ni = i->next;
    emi_free(S, i, sizeof *i + strlen(i->s) + 1);
  }
  emi_free(S, p->merged, sizeof *p->merged * (size_t)p->nmerged);
  pthread_mutex_destroy(&p->mu);
  emi_free(S, p, sizeof *p);
}

void emi_profile_free(em_state *S) {
  emi_profiler *p = S->profiler;
  __atomic_store_n(&S->profiler, NULL, __ATOMIC_RELEASE);
  profiler_free(p);
  profiler_free(S->profile_last);
  S->profile_last = NULL;
}

/* -- Recording points ------------------------------------------------------------------ */

double emi_profile_op_begin(em_state *S) { (void)S; return emi_now(); }

void emi_profile_op_end(em_state *S, const char *op, const em_tensor *t, double t0) {
  emi_profiler *p = emi_profiler_of(S);
  if (!p) return;
  em_profile_event ev;
  memset(&ev, 0, sizeof ev);
  ev.t0 = t0;
  ev.t1 = emi_now();
  ev.name = op;
  ev.kind = EM_PROF_OP;
  ev.dtype = t->dtype;
  ev.device = t->device;
  ev.ndim = t->ndim;
  for (int d = 0; d < t->ndim && d < 8; d++) ev.sizes[d] = t->sizes[d];
  ev.mem = __atomic_load_n(&S->mem_allocated, __ATOMIC_RELAXED);
  emi_profile_record(p, &ev);
}

void emi_profile_span(em_state *S, int kind, const char *name, double t0, double t1,
                      int64_t bytes) {
  emi_profiler *p = emi_profiler_of(S);
  if (!p) return;
  em_profile_event ev;
  memset(&ev, 0, sizeof ev);
  ev.t0 = t0;
  ev.t1 = t1;
  ev.name = name;
  ev.kind = kind;
  ev.device = EM_CPU;
  ev.bytes = bytes;
  emi_profile_record(p, &ev);
}

/* Called by the loader as it hands out a batch: a step mark when auto_step. */
void emi_profile_batch_out(em_state *S, double t) {
  emi_profiler *p = emi_profiler_of(S);
  if (p && p->auto_step && !p->explicit_steps)
    emi_profile_span(S, EM_PROF_STEP, "step", t, t, 0);
}

/* -- Public ---------------------------------------------------------------------------- */

em_status em_profile_start(em_state *S, const em_profile_config *cfg) {
  if (S->profiler)
    return emi_error(S, EM_ERR_ARG, "profile.start: already recording (call stop first)");
  profiler_free(S->profile_last);
  S->profile_last = NULL;
  emi_profiler *p = emi_malloc(S, sizeof *p);
  if (!p) return emi_error(S, EM_ERR_NOMEM, "profile.start: out of memory");
  memset(p, 0, sizeof *p);
  p->S = S;
  p->id = __atomic_fetch_add(&next_profiler_id, 1, __ATOMIC_RELAXED);
  pthread_mutex_init(&p->mu, NULL);
  p->main_thread = pthread_self();
  p->auto_step = cfg ? cfg->auto_step : 0;
  p->origin = emi_now();
  p->saved_peak = __atomic_load_n(&S->mem_peak, __ATOMIC_RELAXED);
  __atomic_store_n(&S->mem_peak, __atomic_load_n(&S->mem_allocated, __ATOMIC_RELAXED),
                   __ATOMIC_RELAXED);
  __atomic_store_n(&S->profiler, p, __ATOMIC_RELEASE);
  return EM_OK;
}

int em_profile_active(em_state *S) { return S && emi_profiler_of(S) != NULL; }

static int by_start(const void *x, const void *y) {
  const em_profile_event *a = x, *b = y;
  if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
  if (a->t1 != b->t1) return a->t1 > b->t1 ? -1 : 1;   /* enclosing spans first */
  return a->track - b->track;
}

em_status em_profile_stop(em_state *S) {
  emi_profiler *p = S->profiler;
  if (!p) return emi_error(S, EM_ERR_ARG, "profile.stop: not recording (call start first)");
  __atomic_store_n(&S->profiler, NULL, __ATOMIC_RELEASE);
  p->peak = __atomic_load_n(&S->mem_peak, __ATOMIC_RELAXED);
  if (p->saved_peak > p->peak) __atomic_store_n(&S->mem_peak, p->saved_peak, __ATOMIC_RELAXED);
  pthread_mutex_lock(&p->mu);
  int64_t total = 0;
  for (prof_buf *b = p->bufs; b; b = b->next) {
    total += __atomic_load_n(&b->count, __ATOMIC_ACQUIRE);
    p->dropped += __atomic_load_n(&b->dropped, __ATOMIC_RELAXED);
  }
  em_profile_event *all = total ? emi_malloc(S, sizeof *all * (size_t)total) : NULL;
  if (total && !all) {
    pthread_mutex_unlock(&p->mu);
    S->profile_last = p;
    return emi_error(S, EM_ERR_NOMEM, "profile.stop: out of memory merging %lld events",
                     (long long)total);
  }
  int64_t k = 0;
  for (prof_buf *b = p->bufs; b; b = b->next) {
    int64_t n = __atomic_load_n(&b->count, __ATOMIC_ACQUIRE);
    for (int64_t i = 0; i < n && k < total; i++) {
      em_profile_event *e = &all[k++];
      *e = b->chunks[i / CHUNK_EVENTS][i % CHUNK_EVENTS];
      e->t0 -= p->origin;
      e->t1 -= p->origin;
    }
  }
  pthread_mutex_unlock(&p->mu);
  if (k > 1) qsort(all, (size_t)k, sizeof *all, by_start);
  p->merged = all;
  p->nmerged = k;
  S->profile_last = p;
  return EM_OK;
}

static emi_profiler *finished(em_state *S) { return S ? S->profile_last : NULL; }

em_status em_profile_events(em_state *S, const em_profile_event **events, int64_t *n) {
  emi_profiler *p = finished(S);
  if (!events || !n) return emi_error(S, EM_ERR_ARG, "profile.events: NULL output");
  *events = p ? p->merged : NULL;
  *n = p ? p->nmerged : 0;
  if (!p) return emi_error(S, EM_ERR_ARG, "profile.events: no finished profile (start, "
                           "then stop)");
  return EM_OK;
}

double em_profile_origin(em_state *S) { emi_profiler *p = finished(S); return p ? p->origin : 0; }
int em_profile_num_tracks(em_state *S) { emi_profiler *p = finished(S); return p ? p->ntracks : 0; }
const char *em_profile_track_name(em_state *S, int track) {
  emi_profiler *p = finished(S);
  return p && track >= 0 && track < p->ntracks ? p->tracks[track] : "";
}
int64_t em_profile_dropped(em_state *S) { emi_profiler *p = finished(S); return p ? p->dropped : 0; }

int64_t em_profile_peak_bytes(em_state *S, int device) {
  emi_profiler *p = finished(S);
  return p && device == EM_CPU ? p->peak : 0;
}

double em_profile_clock(void) { return emi_now(); }

em_status em_profile_step(em_state *S) {
  emi_profiler *p = S->profiler;
  if (!p) return EM_OK;
  p->explicit_steps = 1;
  double t = emi_now();
  emi_profile_span(S, EM_PROF_STEP, "step", t, t, 0);
  return EM_OK;
}

em_status em_profile_range_push(em_state *S, const char *name, int kind) {
  emi_profiler *p = emi_profiler_of(S);
  if (!p) return EM_OK;
  if (kind != EM_PROF_RANGE && kind != EM_PROF_OPTIMIZER && kind != EM_PROF_BUBBLE)
    return emi_error(S, EM_ERR_ARG, "profile.range: kind must be a range, an optimizer "
                     "step or a pipeline bubble, got %d", kind);
  prof_buf *b = thread_buf(p);
  if (!b) return EM_OK;
  if (b->depth >= MAX_RANGE_DEPTH)
    return emi_error(S, EM_ERR_ARG, "profile.range: ranges nest %d deep at most ('%s')",
                     MAX_RANGE_DEPTH, name ? name : "?");
  b->ranges[b->depth].name = emi_profile_intern(p, name);
  b->ranges[b->depth].kind = kind;
  b->ranges[b->depth].t0 = emi_now();
  b->depth++;
  return EM_OK;
}

em_status em_profile_range_pop(em_state *S) {
  emi_profiler *p = emi_profiler_of(S);
  if (!p) return EM_OK;
  prof_buf *b = thread_buf(p);
  if (!b || b->depth == 0) return EM_OK;   /* the range began before start() */
  b->depth--;
  emi_profile_span(S, b->ranges[b->depth].kind, b->ranges[b->depth].name,
                   b->ranges[b->depth].t0, emi_now(), 0);
  return EM_OK;
}
