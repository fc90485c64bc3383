/*
** runtime_emu.c -- the emulated device runtime: the runtime object, devices and
** their memory. Streams, events and launches are in stream_emu.c.
**
** Why an emulator. The CUDA backend's own logic -- its caching allocator, its
** stream and event discipline, its kernels -- must be tested on machines with
** no GPU (DESIGN.md, principle 8). A real device gives memory that host code
** cannot touch, a memory cap, asynchronous streams and sticky errors; this file
** and stream_emu.c give the same semantics on the host, stricter where strictness
** finds bugs early:
**   - Device memory is host memory behind a wall. Every block has guard bytes
**     before and after it (a known pattern, checked when it is freed and by
**     emk_emu_check_guards), and its body starts poisoned (0xCB) rather than
**     zeroed, so a kernel that reads memory nobody wrote gets garbage, as on a
**     GPU. Copies and memsets check their device ranges against the table of
**     live blocks before touching a byte, so a wrong size or offset is an error
**     on the stream instead of silent corruption; what writes past a block
**     anyway (a kernel's bad index) lands in a guard and is reported.
**   - Each device has a capacity; an allocation beyond it is EM_ERR_NOMEM with a
**     message naming the device, the size asked and what is in use. The k-th
**     allocation from now can be made to fail (emk_emu_fail_nth_malloc), so
**     every error path of the allocator can be walked.
**   - free() first waits for the device's streams to finish the work queued
**     before it (cudaFree synchronises likewise), and then for the copies
**     running on the block right now (pins), so a race in the caller is an
**     error message, never a use-after-free inside the runtime.
**   - Contexts are recorded: every entry that makes a CUDA context on a real
**     device (memory, streams, events, mem_info, conv_algos; pinned memory
**     through the first device with one, else cuda:0) marks its device, and
**     device_count and device_props mark none, as on CUDA. So a test sees a
**     state that opens a device it does not use (emk_emu_contexts) -- on a real
**     machine, a context on every GPU for every process.
** Block tables are sorted arrays searched by bisection: allocations are few
** (the caching allocator keeps big segments) while lookups come with every copy.
*/
#include "emu.h"
#include "../dnn.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMU_POISON_NEW 0xCB     /* a fresh block's body */
#define EMU_POISON_FREED 0xDD   /* a freed block, until the host allocator reuses it */

static const emk_runtime_ops emu_ops;

static emu *emu_of(emk_runtime *rt) {
  return rt && rt->ops == &emu_ops ? (emu *)rt->impl : NULL;
}

em_status emi_emu_fail(emu *E, em_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&E->err_mu);
  vsnprintf(E->rt.errmsg, sizeof E->rt.errmsg, fmt, ap);
  pthread_mutex_unlock(&E->err_mu);
  va_end(ap);
  return code;
}

/* "3.00 MiB (3145728 bytes)" */
static const char *fmt_bytes(char *buf, size_t len, size_t n) {
  if (n >= (size_t)1 << 30) snprintf(buf, len, "%.2f GiB (%zu bytes)", n / 1073741824.0, n);
  else if (n >= (size_t)1 << 20) snprintf(buf, len, "%.2f MiB (%zu bytes)", n / 1048576.0, n);
  else if (n >= (size_t)1 << 10) snprintf(buf, len, "%.2f KiB (%zu bytes)", n / 1024.0, n);
  else snprintf(buf, len, "%zu bytes", n);
  return buf;
}

/* -- Parsing EMBER_CUDA_EMULATE ---------------------------------------------------- */

/* A decimal number of at most 9 digits at *s (no sign, no spaces); -1 if none. */
static long parse_num(const char **s) {
  const char *p = *s;
  long v = 0;
  int k = 0;
  while (*p >= '0' && *p <= '9') {
    if (++k > 9) return -1;
    v = v * 10 + (*p++ - '0');
  }
  if (!k) return -1;
  *s = p;
  return v;
}

em_status emk_emu_parse(const char *text, emk_emu_config *out, char *err, size_t errlen) {
  static const char form[] = "expected N or N:MB (N emulated devices, 1 to 16; "
                             "MB of memory per device, at least 1)";
  emk_emu_config c = {0, 0};
  if (out) *out = c;
  if (!text || !out) {
    snprintf(err, errlen, "EMBER_CUDA_EMULATE: no text; %s", form);
    return EM_ERR_ARG;
  }
  const char *s = text;
  long n = parse_num(&s), mb = 0;
  if (n < 0 || (*s && *s != ':')) {
    snprintf(err, errlen, "EMBER_CUDA_EMULATE=\"%s\": %s", text, form);
    return EM_ERR_ARG;
  }
  if (n < 1 || n > EMK_MAX_DEVICES) {
    snprintf(err, errlen, "EMBER_CUDA_EMULATE=\"%s\": %ld devices; the emulator "
             "has 1 to %d", text, n, EMK_MAX_DEVICES);
    return EM_ERR_ARG;
  }
  if (*s == ':') {
    s++;
    mb = parse_num(&s);
    if (mb < 0 || *s) {
      snprintf(err, errlen, "EMBER_CUDA_EMULATE=\"%s\": %s", text, form);
      return EM_ERR_ARG;
    }
    if (mb < 1) {
      snprintf(err, errlen, "EMBER_CUDA_EMULATE=\"%s\": %ld MB per device; at least 1",
               text, mb);
      return EM_ERR_ARG;
    }
  }
  out->devices = (int)n;
  out->capacity = (size_t)mb << 20;      /* 0 when not given: the default */
  return EM_OK;
}

/* -- Block tables ------------------------------------------------------------------ */

/* Index of the last block with p <= q, or -1. */
static long table_floor(const emu_table *t, const unsigned char *q) {
  long lo = 0, hi = (long)t->len - 1, at = -1;
  while (lo <= hi) {
    long mid = lo + (hi - lo) / 2;
    if (t->v[mid]->p <= q) { at = mid; lo = mid + 1; }
    else hi = mid - 1;
  }
  return at;
}

static int table_insert(emu_table *t, emu_block *b) {
  if (t->len == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    emu_block **v = realloc(t->v, cap * sizeof *v);
    if (!v) return 0;
    t->v = v;
    t->cap = cap;
  }
  size_t at = (size_t)(table_floor(t, b->p) + 1);
  memmove(t->v + at + 1, t->v + at, (t->len - at) * sizeof *t->v);
  t->v[at] = b;
  t->len++;
  return 1;
}

static void table_remove(emu_table *t, size_t at) {
  memmove(t->v + at, t->v + at + 1, (t->len - at - 1) * sizeof *t->v);
  t->len--;
}

/* The whole span a block occupies, guards included. */
static const unsigned char *span_lo(const emu_block *b) { return b->raw; }
static const unsigned char *span_hi(const emu_block *b) {
  return b->dev < 0 ? b->p + b->n : b->p + b->n + EMU_TAIL;
}

/* The live device block (any device) holding [p, p+n) entirely, or NULL. */
static emu_block *find_block(emu *E, const unsigned char *p, size_t n) {
  for (int d = 0; d < E->ndev; d++) {
    long i = table_floor(&E->dev[d], p);
    if (i < 0) continue;
    emu_block *b = E->dev[d].v[i];
    size_t off = (size_t)(p - b->p);
    if (off <= b->n && n <= b->n - off) return b;
  }
  return NULL;
}

/* The device block whose span (guards included) holds p, or NULL. */
static emu_block *find_span(emu *E, const unsigned char *p) {
  for (int d = 0; d < E->ndev; d++) {
    emu_table *t = &E->dev[d];
    long i = table_floor(t, p + EMU_HEAD);     /* a block starts at most HEAD after p */
    if (i >= 0 && p >= span_lo(t->v[i]) && p < span_hi(t->v[i])) return t->v[i];
  }
  return NULL;
}

static const char *describe_block(char *buf, size_t len, const emu_block *b) {
  snprintf(buf, len, "cuda:%d block #%llu (%zu bytes at %p)", b->dev, b->id, b->n,
           (void *)b->p);
  return buf;
}

/* Why [p, p+n) is not inside one live block: which block it overruns or
** precedes, or a recently freed block that held it. Under mem_mu. */
static void describe_miss(emu *E, const unsigned char *p, size_t n, char *why, size_t len) {
  char blk[128];
  const emu_block *below = NULL, *above = NULL;
  for (int d = 0; d < E->ndev; d++) {
    emu_table *t = &E->dev[d];
    long i = table_floor(t, p);
    if (i >= 0 && (!below || t->v[i]->p > below->p)) below = t->v[i];
    if (i + 1 < (long)t->len && (!above || t->v[i + 1]->p < above->p)) above = t->v[i + 1];
  }
  if (below && p < below->p + below->n) {
    snprintf(why, len, "[%p, +%zu) runs %zu bytes past the end of %s", (void *)p, n,
             (size_t)(p + n - (below->p + below->n)), describe_block(blk, sizeof blk, below));
    return;
  }
  if (below && p < below->p + below->n + EMU_TAIL) {
    snprintf(why, len, "[%p, +%zu) starts %zu bytes past the end of %s", (void *)p, n,
             (size_t)(p - (below->p + below->n)), describe_block(blk, sizeof blk, below));
    return;
  }
  if (above && p + n > span_lo(above)) {
    snprintf(why, len, "[%p, +%zu) starts %zu bytes before %s", (void *)p, n,
             (size_t)(above->p - p), describe_block(blk, sizeof blk, above));
    return;
  }
  for (unsigned k = 0; k < EMU_FREED_RING; k++) {
    const emu_freed *f = &E->freed[(E->freed_next + EMU_FREED_RING - 1 - k) % EMU_FREED_RING];
    if (f->p && p >= f->p && p < f->p + f->n) {
      snprintf(why, len, "[%p, +%zu) lies in cuda:%d block #%llu (%zu bytes at %p), "
               "which was freed", (void *)p, n, f->dev, f->id, f->n, (void *)f->p);
      return;
    }
  }
  snprintf(why, len, "[%p, +%zu) is not inside any live device block", (void *)p, n);
}

int emi_emu_pin(emu *E, const void *p, size_t n, emu_block **out, char *why, size_t whylen) {
  pthread_mutex_lock(&E->mem_mu);
  emu_block *b = p ? find_block(E, p, n) : NULL;
  if (b) b->pins++;
  else if (!p) snprintf(why, whylen, "NULL");
  else describe_miss(E, p, n, why, whylen);
  pthread_mutex_unlock(&E->mem_mu);
  *out = b;
  return b != NULL;
}

int emi_emu_foreign_pointer(emu *E, const void *args, size_t n, int dev, size_t *off,
                            int *owner) {
  int hit = 0;
  pthread_mutex_lock(&E->mem_mu);
  for (size_t o = 0; o + sizeof(void *) <= n && !hit; o += sizeof(void *)) {
    const unsigned char *p;
    memcpy(&p, (const unsigned char *)args + o, sizeof p);
    emu_block *b = p ? find_block(E, p, 0) : NULL;
    if (b && b->dev != dev) {
      hit = 1;
      *off = o;
      *owner = b->dev;
    }
  }
  pthread_mutex_unlock(&E->mem_mu);
  return hit;
}

void emi_emu_unpin(emu *E, emu_block *b) {
  pthread_mutex_lock(&E->mem_mu);
  if (--b->pins == 0) pthread_cond_broadcast(&E->mem_cv);
  pthread_mutex_unlock(&E->mem_mu);
}

int emi_emu_is_device(emu *E, const void *p, size_t n, char *why, size_t whylen) {
  const unsigned char *lo = p, *hi = lo + n;
  int hit = 0;
  char blk[128];
  pthread_mutex_lock(&E->mem_mu);
  for (int d = 0; d < E->ndev && !hit; d++) {
    emu_table *t = &E->dev[d];
    /* the last block starting before hi, and the one before it (spans may start
    ** up to HEAD bytes before p) */
    long i = table_floor(t, hi + EMU_HEAD);
    for (long j = i; j >= 0 && j >= i - 1 && !hit; j--)
      if (span_lo(t->v[j]) < hi && span_hi(t->v[j]) > lo) {
        hit = 1;
        snprintf(why, whylen, "[%p, +%zu) is device memory (%s)", p, n,
                 describe_block(blk, sizeof blk, t->v[j]));
      }
  }
  pthread_mutex_unlock(&E->mem_mu);
  return hit;
}

int emi_emu_is_pinned(emu *E, const void *p, size_t n) {
  pthread_mutex_lock(&E->mem_mu);
  long i = table_floor(&E->host, p);
  emu_block *b = i >= 0 ? E->host.v[i] : NULL;
  int pinned = b && (size_t)((const unsigned char *)p - b->p) + n <= b->n;
  pthread_mutex_unlock(&E->mem_mu);
  return pinned;
}

void emi_emu_note_host_side(emu *E, const void *p, size_t n) {
  if (emi_emu_is_pinned(E, p, n)) return;
  pthread_mutex_lock(&E->mem_mu);
  E->pageable_copies++;
  pthread_mutex_unlock(&E->mem_mu);
}

/* -- Guards ------------------------------------------------------------------------ */

/* Varied, never 0x00 or 0xFF (the likeliest stray values), different before and
** after a block. */
static unsigned char guard_byte(size_t i, int tail) {
  return (unsigned char)(0x5A + (i * 7 + (tail ? 29 : 0)) % 0x4B);
}

static void guards_write(emu_block *b) {
  unsigned char *h = b->p - EMU_HEAD, *t = b->p + b->n;
  for (size_t i = 0; i < EMU_HEAD; i++) h[i] = guard_byte(i, 0);
  for (size_t i = 0; i < EMU_TAIL; i++) t[i] = guard_byte(i, 1);
}

/* 0 when both guards are intact; otherwise 1 and a message. */
static int guards_check(const emu_block *b, char *msg, size_t len) {
  const unsigned char *h = b->p - EMU_HEAD, *t = b->p + b->n;
  size_t nh = 0, nt = 0, first_h = 0, last_t = 0;
  for (size_t i = 0; i < EMU_HEAD; i++)
    if (h[i] != guard_byte(i, 0) && !nh++) first_h = EMU_HEAD - i;
  for (size_t i = 0; i < EMU_TAIL; i++)
    if (t[i] != guard_byte(i, 1)) { nt++; last_t = i; }
  if (!nh && !nt) return 0;
  char blk[128], a[96] = "", c[96] = "";
  if (nh) snprintf(a, sizeof a, "%zu guard bytes before its start (the farthest %zu "
                   "bytes before)", nh, first_h);
  if (nt) snprintf(c, sizeof c, "%zu guard bytes after its end (the farthest at end+%zu)",
                   nt, last_t);
  snprintf(msg, len, "%s: overwritten %s%s%s", describe_block(blk, sizeof blk, b), a,
           nh && nt ? " and " : "", c);
  return 1;
}

/* -- Devices ----------------------------------------------------------------------- */

static int dev_ok(emu *E, int dev) { return dev >= 0 && dev < E->ndev; }

em_status emi_emu_context(emu *E, int dev, const char *what) {
  unsigned bit = 1u << dev;
  if (__atomic_load_n(&E->contexts, __ATOMIC_ACQUIRE) & bit) return EM_OK;
  if (__atomic_load_n(&E->unavailable, __ATOMIC_ACQUIRE) & bit)
    return emi_emu_fail(E, EM_ERR_DEVICE, "%s (cuda:%d): cudaErrorDevicesUnavailable: CUDA-"
                        "capable device(s) is/are busy or unavailable (emulated: the device "
                        "is in EXCLUSIVE_PROCESS mode and another process holds it)", what, dev);
  __atomic_fetch_or(&E->contexts, bit, __ATOMIC_RELEASE);
  int none = -1;
  __atomic_compare_exchange_n(&E->home, &none, dev, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return EM_OK;
}

/* Pinned host memory's device: the first with a context, else cuda:0's (which
** CUDA makes for a thread that never chose a device). */
static em_status host_context(emu *E, const char *what) {
  int h = __atomic_load_n(&E->home, __ATOMIC_RELAXED);
  return emi_emu_context(E, h >= 0 ? h : 0, what);
}

static em_status no_device(emu *E, const char *what, int dev) {
  return emi_emu_fail(E, EM_ERR_DEVICE, "%s: no device cuda:%d (the emulated runtime has "
                      "%d device%s)", what, dev, E->ndev, E->ndev == 1 ? "" : "s");
}

static int emu_device_count(emk_runtime *rt) {
  emu *E = emu_of(rt);
  return E ? E->ndev : 0;
}

static em_status emu_device_props(emk_runtime *rt, int dev, emk_device_props *out) {
  emu *E = emu_of(rt);
  if (!dev_ok(E, dev)) return no_device(E, "device_props", dev);
  if (!out) return emi_emu_fail(E, EM_ERR_ARG, "device_props: no output (NULL)");
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "ember emulated device");
  out->major = 9;
  out->minor = 0;
  out->multiprocessors = 4;
  out->warp_size = EMK_WARP_SIZE;
  out->max_threads_per_block = EMU_MAX_BLOCK_THREADS;
  out->shared_per_block = EMU_SHARED_PER_BLOCK;
  out->total_memory = E->capacity;
  out->emulated = 1;
  return EM_OK;
}

static em_status emu_mem_info(emk_runtime *rt, int dev, size_t *free_bytes, size_t *total) {
  emu *E = emu_of(rt);
  if (!dev_ok(E, dev)) return no_device(E, "mem_info", dev);
  em_status st = emi_emu_context(E, dev, "mem_info");   /* cudaMemGetInfo needs one */
  if (st) return st;
  pthread_mutex_lock(&E->mem_mu);
  size_t used = E->dev[dev].bytes;
  pthread_mutex_unlock(&E->mem_mu);
  if (free_bytes) *free_bytes = E->capacity - used;
  if (total) *total = E->capacity;
  return EM_OK;
}

/* -- Device memory ------------------------------------------------------------------- */

static em_status emu_malloc(emk_runtime *rt, int dev, size_t n, void **out) {
  emu *E = emu_of(rt);
  char a[64], b[64], c[64];
  if (!dev_ok(E, dev)) return no_device(E, "malloc", dev);
  if (!out) return emi_emu_fail(E, EM_ERR_ARG, "malloc on cuda:%d: no output (NULL)", dev);
  *out = NULL;
  if (n == 0) return emi_emu_fail(E, EM_ERR_ARG, "malloc on cuda:%d: 0 bytes asked", dev);
  em_status st = emi_emu_context(E, dev, "malloc");
  if (st) return st;
  emu_table *t = &E->dev[dev];
  /* Reserve the bytes under the lock, allocate and poison outside it. */
  pthread_mutex_lock(&E->mem_mu);
  if (E->fail_countdown > 0 && --E->fail_countdown == 0) {
    size_t used = t->bytes;
    pthread_mutex_unlock(&E->mem_mu);
    return emi_emu_fail(E, EM_ERR_NOMEM, "cuda:%d: out of memory allocating %s (an injected "
                        "failure); %s of %s in use", dev, fmt_bytes(a, sizeof a, n),
                        fmt_bytes(b, sizeof b, used), fmt_bytes(c, sizeof c, E->capacity));
  }
  if (n > E->capacity - t->bytes) {
    size_t used = t->bytes;
    pthread_mutex_unlock(&E->mem_mu);
    return emi_emu_fail(E, EM_ERR_NOMEM, "cuda:%d: out of memory allocating %s; %s of %s in "
                        "use, %zu bytes free", dev, fmt_bytes(a, sizeof a, n),
                        fmt_bytes(b, sizeof b, used), fmt_bytes(c, sizeof c, E->capacity),
                        E->capacity - used);
  }
  t->bytes += n;
  unsigned long long id = ++E->next_block;
  pthread_mutex_unlock(&E->mem_mu);

  emu_block *blk = malloc(sizeof *blk);
  void *raw = NULL;
  if (!blk || posix_memalign(&raw, EMU_ALIGN, EMU_HEAD + n + EMU_TAIL)) {
    free(blk);
    pthread_mutex_lock(&E->mem_mu);
    t->bytes -= n;
    pthread_mutex_unlock(&E->mem_mu);
    return emi_emu_fail(E, EM_ERR_NOMEM, "cuda:%d: the host could not give %s for an "
                        "emulated block", dev, fmt_bytes(a, sizeof a, n));
  }
  *blk = (emu_block){.raw = raw, .p = (unsigned char *)raw + EMU_HEAD, .n = n, .dev = dev,
                     .id = id};
  guards_write(blk);
  memset(blk->p, EMU_POISON_NEW, n);
  pthread_mutex_lock(&E->mem_mu);
  int ok = table_insert(t, blk);
  if (!ok) t->bytes -= n;
  pthread_mutex_unlock(&E->mem_mu);
  if (!ok) {
    free(raw);
    free(blk);
    return emi_emu_fail(E, EM_ERR_NOMEM, "cuda:%d: no host memory for the block table", dev);
  }
  *out = blk->p;
  return EM_OK;
}

static em_status emu_free(emk_runtime *rt, int dev, void *ptr) {
  emu *E = emu_of(rt);
  unsigned char *p = ptr;
  char blk[128];
  if (!dev_ok(E, dev)) return no_device(E, "free", dev);
  if (!p) return emi_emu_fail(E, EM_ERR_ARG, "free on cuda:%d: NULL pointer", dev);
  em_status st = emi_emu_context(E, dev, "free");
  if (st) return st;
  /* As cudaFree: the device's queued work may still use the block. */
  if ((st = emi_emu_drain(E, dev, "free"))) return st;
  pthread_mutex_lock(&E->mem_mu);
  emu_table *t = &E->dev[dev];
  long i = table_floor(t, p);
  if (i < 0 || t->v[i]->p != p) {
    char why[320];
    emu_block *in = find_block(E, p, 0), *o = NULL;
    if (in && in->dev == dev)
      snprintf(why, sizeof why, "it points %zu bytes into %s, not at its start",
               (size_t)(p - in->p), describe_block(blk, sizeof blk, in));
    else if (in)
      snprintf(why, sizeof why, "it is %s%s: free it on cuda:%d",
               in->p == p ? "" : "inside ", describe_block(blk, sizeof blk, in), in->dev);
    else if ((i = table_floor(&E->host, p)) >= 0 && (o = E->host.v[i])->p == p)
      snprintf(why, sizeof why, "it is pinned host memory (host_free)");
    else {
      describe_miss(E, p, 1, why, sizeof why);
      if (!strstr(why, "freed"))
        snprintf(why, sizeof why, "it is not a live device block (never allocated, or "
                 "freed already)");
    }
    pthread_mutex_unlock(&E->mem_mu);
    return emi_emu_fail(E, EM_ERR_ARG, "free on cuda:%d of %p: %s", dev, ptr, why);
  }
  emu_block *b = t->v[i];
  table_remove(t, (size_t)i);
  t->bytes -= b->n;
  /* Copies that pinned it before it left the table finish first. */
  while (b->pins) pthread_cond_wait(&E->mem_cv, &E->mem_mu);
  E->freed[E->freed_next] = (emu_freed){b->p, b->n, b->dev, b->id};
  E->freed_next = (E->freed_next + 1) % EMU_FREED_RING;
  pthread_mutex_unlock(&E->mem_mu);
  char msg[400];
  int bad = guards_check(b, msg, sizeof msg);
  memset(b->raw, EMU_POISON_FREED, EMU_HEAD + b->n + EMU_TAIL);
  free(b->raw);
  free(b);
  if (bad)
    return emi_emu_fail(E, EM_ERR_INTERNAL, "free on cuda:%d: %s (something wrote outside "
                        "the block; it is freed now)", dev, msg);
  return EM_OK;
}

/* -- Pinned host memory ------------------------------------------------------------ */

static em_status emu_host_alloc(emk_runtime *rt, size_t n, void **out) {
  emu *E = emu_of(rt);
  char a[64];
  if (!out) return emi_emu_fail(E, EM_ERR_ARG, "host_alloc: no output (NULL)");
  *out = NULL;
  if (n == 0) return emi_emu_fail(E, EM_ERR_ARG, "host_alloc: 0 bytes asked");
  em_status st = host_context(E, "host_alloc");
  if (st) return st;
  emu_block *b = malloc(sizeof *b);
  void *raw = NULL;
  if (!b || posix_memalign(&raw, EMU_HOST_ALIGN, n)) {
    free(b);
    return emi_emu_fail(E, EM_ERR_NOMEM, "host_alloc: out of host memory allocating %s",
                        fmt_bytes(a, sizeof a, n));
  }
  pthread_mutex_lock(&E->mem_mu);
  *b = (emu_block){.raw = raw, .p = raw, .n = n, .dev = -1, .id = ++E->next_block};
  int ok = table_insert(&E->host, b);
  if (ok) E->host.bytes += n;
  pthread_mutex_unlock(&E->mem_mu);
  if (!ok) {
    free(raw);
    free(b);
    return emi_emu_fail(E, EM_ERR_NOMEM, "host_alloc: no host memory for the block table");
  }
  *out = raw;
  return EM_OK;
}

static em_status emu_host_free(emk_runtime *rt, void *p) {
  emu *E = emu_of(rt);
  char why[320] = "";
  if (!p) return emi_emu_fail(E, EM_ERR_ARG, "host_free: NULL pointer");
  em_status st = host_context(E, "host_free");
  if (st) return st;
  /* Queued copies may still read or write it (cudaFreeHost synchronises too). */
  if ((st = emi_emu_drain(E, -1, "host_free"))) return st;
  pthread_mutex_lock(&E->mem_mu);
  long i = table_floor(&E->host, p);
  emu_block *b = i >= 0 ? E->host.v[i] : NULL;
  if (b && b->p == p) {
    table_remove(&E->host, (size_t)i);
    E->host.bytes -= b->n;
  } else {
    if (b && (unsigned char *)p < b->p + b->n)
      snprintf(why, sizeof why, "it points %zu bytes into a pinned block of %zu bytes, not "
               "at its start", (size_t)((unsigned char *)p - b->p), b->n);
    b = NULL;
  }
  pthread_mutex_unlock(&E->mem_mu);
  if (!b) {
    if (!why[0] && !emi_emu_is_device(E, p, 1, why, sizeof why))
      snprintf(why, sizeof why, "it is not live pinned memory (never allocated by "
               "host_alloc, or freed already)");
    return emi_emu_fail(E, EM_ERR_ARG, "host_free of %p: %s", p, why);
  }
  free(b->raw);
  free(b);
  return EM_OK;
}

/* -- Opening and closing ----------------------------------------------------------- */

static void emu_close(emk_runtime *rt) {
  emu *E = emu_of(rt);
  if (!E) return;
  emi_emu_streams_close(E);
  for (int d = 0; d < E->ndev; d++) {
    for (size_t i = 0; i < E->dev[d].len; i++) {
      free(E->dev[d].v[i]->raw);
      free(E->dev[d].v[i]);
    }
    free(E->dev[d].v);
  }
  for (size_t i = 0; i < E->host.len; i++) {
    free(E->host.v[i]->raw);
    free(E->host.v[i]);
  }
  free(E->host.v);
  pthread_mutex_destroy(&E->mu);
  pthread_cond_destroy(&E->mem_cv);
  pthread_mutex_destroy(&E->mem_mu);
  pthread_mutex_destroy(&E->err_mu);
  free(E);
}

em_status emk_emu_open(const emk_emu_config *cfg, emk_runtime **out, char *err,
                       size_t errlen) {
  if (!out) {
    snprintf(err, errlen, "emulated runtime: no output (NULL)");
    return EM_ERR_ARG;
  }
  *out = NULL;
  if (!cfg || cfg->devices < 1 || cfg->devices > EMK_MAX_DEVICES) {
    snprintf(err, errlen, "emulated runtime: %d devices asked; 1 to %d", cfg ? cfg->devices : 0,
             EMK_MAX_DEVICES);
    return EM_ERR_ARG;
  }
  emu *E = calloc(1, sizeof *E);
  if (!E) {
    snprintf(err, errlen, "emulated runtime: out of host memory");
    return EM_ERR_NOMEM;
  }
  E->rt.ops = &emu_ops;
  E->rt.impl = E;
  E->ndev = cfg->devices;
  E->capacity = cfg->capacity ? cfg->capacity : (size_t)1024 << 20;
  E->home = -1;
  pthread_mutex_init(&E->err_mu, NULL);
  pthread_mutex_init(&E->mem_mu, NULL);
  pthread_cond_init(&E->mem_cv, NULL);
  pthread_mutex_init(&E->mu, NULL);
  *out = &E->rt;
  return EM_OK;
}

static const emk_runtime_ops emu_ops = {
  .name = "emulated",
  .close = emu_close,
  .device_count = emu_device_count,
  .device_props = emu_device_props,
  .mem_info = emu_mem_info,
  .malloc = emu_malloc,
  .free = emu_free,
  .host_alloc = emu_host_alloc,
  .host_free = emu_host_free,
  .stream_create = emi_emu_stream_create,
  .stream_destroy = emi_emu_stream_destroy,
  .stream_sync = emi_emu_stream_sync,
  .memcpy_async = emi_emu_memcpy_async,
  .memset_async = emi_emu_memset_async,
  .memcpy_peer_async = emi_emu_memcpy_peer_async,
  .capture_begin = emi_emu_capture_begin,
  .capture_end = emi_emu_capture_end,
  .graph_launch = emi_emu_graph_launch,
  .graph_destroy = emi_emu_graph_destroy,
  .host_callback = emi_emu_host_callback,
  .event_create = emi_emu_event_create,
  .event_destroy = emi_emu_event_destroy,
  .event_record = emi_emu_event_record,
  .stream_wait_event = emi_emu_stream_wait_event,
  .event_query = emi_emu_event_query,
  .event_sync = emi_emu_event_sync,
  .launch = emi_emu_launch,
  .gemm = emi_emu_gemm,                  /* gemm_emu.c */
  .conv_algos = emi_emu_conv_algos,      /* dnn_emu.c */
  .conv = emi_emu_conv,
  .batch_norm_fwd = emi_emu_batch_norm_fwd,
  .batch_norm_bwd = emi_emu_batch_norm_bwd,
};

/* -- Test hooks -------------------------------------------------------------------- */

void emk_emu_fail_nth_malloc(emk_runtime *rt, int k) {
  emu *E = emu_of(rt);
  if (!E) return;
  pthread_mutex_lock(&E->mem_mu);
  E->fail_countdown = k > 0 ? k : 0;
  pthread_mutex_unlock(&E->mem_mu);
}

size_t emk_emu_bytes_in_use(emk_runtime *rt, int dev) {
  emu *E = emu_of(rt);
  if (!E || dev < -1 || dev >= E->ndev) return 0;
  pthread_mutex_lock(&E->mem_mu);
  size_t n = dev < 0 ? E->host.bytes : E->dev[dev].bytes;
  pthread_mutex_unlock(&E->mem_mu);
  return n;
}

size_t emk_emu_live_blocks(emk_runtime *rt, int dev) {
  emu *E = emu_of(rt);
  if (!E || dev < -1 || dev >= E->ndev) return 0;
  pthread_mutex_lock(&E->mem_mu);
  size_t n = dev < 0 ? E->host.len : E->dev[dev].len;
  pthread_mutex_unlock(&E->mem_mu);
  return n;
}

unsigned emk_emu_contexts(emk_runtime *rt) {
  emu *E = emu_of(rt);
  return E ? __atomic_load_n(&E->contexts, __ATOMIC_RELAXED) : 0;
}

void emk_emu_set_unavailable(emk_runtime *rt, unsigned mask) {
  emu *E = emu_of(rt);
  if (E) __atomic_store_n(&E->unavailable, mask, __ATOMIC_RELEASE);
}

size_t emk_emu_pageable_copies(emk_runtime *rt) {
  emu *E = emu_of(rt);
  if (!E) return 0;
  pthread_mutex_lock(&E->mem_mu);
  size_t n = E->pageable_copies;
  pthread_mutex_unlock(&E->mem_mu);
  return n;
}

int emk_emu_check_guards(emk_runtime *rt, char *msg, size_t msglen) {
  emu *E = emu_of(rt);
  if (msg && msglen) msg[0] = 0;
  if (!E) return 0;
  int bad = 0;
  size_t used = 0;
  pthread_mutex_lock(&E->mem_mu);
  for (int d = 0; d < E->ndev; d++)
    for (size_t i = 0; i < E->dev[d].len; i++) {
      char one[400];
      if (!guards_check(E->dev[d].v[i], one, sizeof one)) continue;
      if (msg && msglen > used + 1) {
        int k = snprintf(msg + used, msglen - used, "%s%s", bad ? "; " : "", one);
        used += k > 0 ? (size_t)k : 0;
        if (used >= msglen) used = msglen - 1;
      }
      bad++;
    }
  pthread_mutex_unlock(&E->mem_mu);
  return bad;
}

em_status emk_emu_check_range(emk_runtime *rt, const void *p, size_t n) {
  emu *E = emu_of(rt);
  if (!E) return rt ? emk_fail(rt, EM_ERR_ARG, "check_range: not the emulated runtime")
                    : EM_ERR_ARG;
  char why[320];
  pthread_mutex_lock(&E->mem_mu);
  int ok = p && find_block(E, p, n);
  if (!ok) {
    if (p) describe_miss(E, p, n, why, sizeof why);
    else snprintf(why, sizeof why, "NULL");
  }
  pthread_mutex_unlock(&E->mem_mu);
  return ok ? EM_OK : emi_emu_fail(E, EM_ERR_ARG, "device range %s", why);
}

em_status emk_emu_write_raw(emk_runtime *rt, void *dst, const void *src, size_t n) {
  emu *E = emu_of(rt);
  if (!E) return rt ? emk_fail(rt, EM_ERR_ARG, "write_raw: not the emulated runtime")
                    : EM_ERR_ARG;
  unsigned char *p = dst;
  pthread_mutex_lock(&E->mem_mu);
  emu_block *b = p && src ? find_span(E, p) : NULL;
  int ok = b && n <= (size_t)(span_hi(b) - p);
  if (ok) memcpy(p, src, n);
  pthread_mutex_unlock(&E->mem_mu);
  return ok ? EM_OK
            : emi_emu_fail(E, EM_ERR_ARG, "write_raw: [%p, +%zu) is not inside one live "
                           "device block and its guards", dst, n);
}
