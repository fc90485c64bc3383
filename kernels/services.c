/*
** services.c -- the CUDA kind's device-services table (emi_services,
** core/backend.h): device facts and memory, the three streams and their events,
** asynchronous copies, pinned memory and the loader's pool of it, and NCCL as
** the device's collective engine. Each entry is the runtime's call (real or
** emulated) on the stream the role names; the loader's feed (core/data/feed.c)
** and the communicators' device side (core/dist/commdev.c) are written on
** these alone. On emulated devices with EMBER_NCCL_EMULATE=1 the collective
** entries go to the stand-in NCCL (kernels/emu/nccl_emu.c) instead.
*/
#include "cuda.h"
#include "real/libs.h"
#include <stdio.h>
#include <stdlib.h>

static emk_runtime *rt_of(emi_device *d) { return emk_dev(d)->cuda->rt; }

/* Streams of a caller's own (stream_new): numbered EMI_STREAM_OWN + slot in one
** table for the process, each slot the device it belongs to and its stream.
** A communicator takes two (comm.h), so 256 serve 128 communicators at once. */
enum { OWN_MAX = 256 };
static struct { emi_device *d; emk_stream *s; } own[OWN_MAX];
static pthread_mutex_t own_mu = PTHREAD_MUTEX_INITIALIZER;

/* The stream of a role; the communication stream is made on first use (most
** states never communicate, and an emulated stream is a thread) and lives with
** the device (cuda.c closes it). NULL when it can't be made. */
static emk_stream *stream_of(emi_device *d, emi_stream s) {
  emk_cuda_device *cd = emk_dev(d);
  if (s == EMI_STREAM_COPY) return cd->copy;
  if (s == EMI_STREAM_COMPUTE) return cd->compute;
  if (s >= EMI_STREAM_OWN) {
    int i = (int)s - EMI_STREAM_OWN;
    emk_stream *r = NULL;
    pthread_mutex_lock(&own_mu);
    if (i < OWN_MAX && own[i].d == d) r = own[i].s;
    pthread_mutex_unlock(&own_mu);
    return r;
  }
  if (!cd->comm) cd->cuda->rt->ops->stream_create(cd->cuda->rt, cd->index, &cd->comm);
  return cd->comm;
}

static em_status stream_new(emi_device *d, emi_stream *out) {
  emk_runtime *rt = emk_dev(d)->cuda->rt;
  emk_stream *s = NULL;
  em_status st = rt->ops->stream_create(rt, d->index, &s);
  if (st) return st;
  pthread_mutex_lock(&own_mu);
  int i = 0;
  while (i < OWN_MAX && own[i].d) i++;
  if (i < OWN_MAX) own[i].d = d, own[i].s = s;
  pthread_mutex_unlock(&own_mu);
  if (i == OWN_MAX) {
    rt->ops->stream_destroy(rt, s);
    return emk_errf(rt->errmsg, sizeof rt->errmsg, EM_ERR_DEVICE, "stream_new: %d streams "
                    "of communicators are in use already", OWN_MAX);
  }
  *out = (emi_stream)(EMI_STREAM_OWN + i);
  return EM_OK;
}

static void stream_free(emi_device *d, emi_stream s) {
  emk_stream *st = s >= EMI_STREAM_OWN ? stream_of(d, s) : NULL;
  if (!st) return;
  emk_runtime *rt = emk_dev(d)->cuda->rt;
  rt->ops->stream_sync(rt, st);
  rt->ops->stream_destroy(rt, st);
  pthread_mutex_lock(&own_mu);
  own[s - EMI_STREAM_OWN].d = NULL;
  own[s - EMI_STREAM_OWN].s = NULL;
  pthread_mutex_unlock(&own_mu);
}

/* -- Facts and memory ------------------------------------------------------------- */

static em_status props(emi_device *d, em_cuda_props *out) {
  emk_device_props p;
  em_status st = rt_of(d)->ops->device_props(rt_of(d), d->index, &p);
  if (st) return st;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", p.name);
  out->major = p.major;
  out->minor = p.minor;
  out->multiprocessors = p.multiprocessors;
  out->total_memory = (int64_t)p.total_memory;
  out->emulated = p.emulated;
  return EM_OK;
}

static em_status memory_stats(emi_device *d, em_cuda_memory *out) {
  emk_alloc_stats a;
  em_status st = emk_alloc_stats_get(emk_dev(d)->cuda->alloc, d->index, &a);
  if (st) return st;
  *out = (em_cuda_memory){(int64_t)a.allocated, (int64_t)a.reserved,
                          (int64_t)a.peak_allocated, (int64_t)a.capacity, a.num_allocs,
                          a.num_frees, a.cache_hits, a.oom_retries};
  return EM_OK;
}

static void reset_peak(emi_device *d) { emk_alloc_reset_peak(emk_dev(d)->cuda->alloc, d->index); }

static em_status empty_cache(emi_device *d) {
  char err[EMK_ERRMSG_SIZE];
  em_status st = emk_alloc_empty_cache(emk_dev(d)->cuda->alloc, d->index, err, sizeof err);
  return st ? emi_error(d->S, st, "cuda.empty_cache: %s", err) : EM_OK;
}

static em_status synchronize(emi_device *d) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  em_status st = rt->ops->stream_sync(rt, cd->copy);
  if (!st) st = rt->ops->stream_sync(rt, cd->compute);
  emk_pinned_collect(cd->cuda);
  return st;
}

static const char *errmsg(emi_device *d) { return rt_of(d)->errmsg; }

/* -- Streams and events ----------------------------------------------------------- */

static em_status stream_sync(emi_device *d, emi_stream s) {
  emk_stream *st = stream_of(d, s);
  return st ? rt_of(d)->ops->stream_sync(rt_of(d), st) : EM_ERR_DEVICE;
}

static em_status event_new(emi_device *d, emi_stream s, emi_event **out) {
  emk_runtime *rt = rt_of(d);
  emk_stream *st = stream_of(d, s);
  emk_event *e = NULL;
  *out = NULL;
  if (!st) return EM_ERR_DEVICE;
  em_status r = rt->ops->event_create(rt, d->index, &e);
  if (!r && (r = rt->ops->event_record(rt, e, st))) rt->ops->event_destroy(rt, e);
  if (!r) *out = (emi_event *)e;
  return r;
}

static em_status event_query(emi_device *d, emi_event *e, int *done) {
  return rt_of(d)->ops->event_query(rt_of(d), (emk_event *)e, done);
}

static em_status event_wait(emi_device *d, emi_stream s, emi_event *e) {
  emk_stream *st = stream_of(d, s);
  return st ? rt_of(d)->ops->stream_wait_event(rt_of(d), st, (emk_event *)e) : EM_ERR_DEVICE;
}

static void event_free(emi_device *d, emi_event *e) {
  if (e) rt_of(d)->ops->event_destroy(rt_of(d), (emk_event *)e);
}

static em_status host_callback(emi_device *d, emi_stream s, void (*fn)(void *), void *ud) {
  emk_stream *st = stream_of(d, s);
  return st ? rt_of(d)->ops->host_callback(rt_of(d), st, fn, ud) : EM_ERR_DEVICE;
}

/* -- Copies and pinned memory ----------------------------------------------------- */

static em_status memcpy_async(emi_device *d, emi_stream s, void *dst, const void *src,
                              size_t n, emi_copy_dir dir) {
  emk_stream *st = stream_of(d, s);
  if (!st) return EM_ERR_DEVICE;
  return rt_of(d)->ops->memcpy_async(rt_of(d), dst, src, n,
                                     dir == EMI_COPY_H2D ? EMK_HOST_TO_DEVICE
                                                         : EMK_DEVICE_TO_HOST, st);
}

static em_status host_alloc(emi_device *d, size_t n, void **out) {
  return rt_of(d)->ops->host_alloc(rt_of(d), n, out);
}

static void host_free(emi_device *d, void *p) {
  if (p) rt_of(d)->ops->host_free(rt_of(d), p);
}

static void host_collect(emi_device *d) { emk_pinned_collect(emk_dev(d)->cuda); }

static em_status pool_new(emi_device *d, int target, emi_pinned_pool **out) {
  emk_pinned_collect(emk_dev(d)->cuda);      /* the host thread: free what died */
  return emk_pinned_pool_new(d->S, emk_dev(d)->cuda, target, out);
}

/* -- The collective engine: NCCL on real GPUs ----------------------------------------
** kernels/real/nccl_real.c is compiled only where the CUDA headers are; the
** references are weak so that a build without them links, and says so. The
** handle keeps the device; each call names the stream it runs on (the
** communicator's own, commdev.c). */
typedef struct emk_nccl emk_nccl;
em_status emk_nccl_init(emk_runtime *rt, int dev, const unsigned char *id, int rank,
                        int nranks, double timeout_s, emk_nccl **out, char *err,
                        size_t errlen) __attribute__((weak));
em_status emk_nccl_group(emk_nccl *n, int start, char *err, size_t errlen)
    __attribute__((weak));
em_status emk_nccl_collective(emk_nccl *n, int kind, int op, em_dtype dt, const void *in,
                              void *out, int64_t count, int root, emk_stream *s, char *err,
                              size_t errlen) __attribute__((weak));
em_status emk_nccl_async_error(emk_nccl *n, char *err, size_t errlen) __attribute__((weak));
void emk_nccl_abort(emk_nccl *n) __attribute__((weak));
void emk_nccl_destroy(emk_nccl *n) __attribute__((weak));

/* The stand-in NCCL of emulated devices (kernels/emu/nccl_emu.c), opted into
** with EMBER_NCCL_EMULATE=1: the same entries, ranks being threads of this
** process. Emulated device memory is host memory, so the stand-in reads and
** writes it directly and the device counts as native (no host staging). */
typedef struct emk_nccl_emu emk_nccl_emu;
int emk_nccl_emu_on(void);
em_status emk_nccl_emu_unique_id(unsigned char id[128]);
em_status emk_nccl_emu_init(emk_runtime *rt, int dev, const unsigned char *id, int rank,
                            int nranks, double timeout_s, emk_nccl_emu **out, char *err,
                            size_t errlen);
em_status emk_nccl_emu_group(emk_nccl_emu *n, int start, char *err, size_t errlen);
em_status emk_nccl_emu_issue(emk_nccl_emu *n, int kind, int op, em_dtype dt, const void *in,
                             void *out, int64_t count, int peer, emk_stream *s, char *err,
                             size_t errlen);
em_status emk_nccl_emu_async_error(emk_nccl_emu *n, char *err, size_t errlen);
void emk_nccl_emu_free(emk_nccl_emu *n, int abort);

struct emi_collective {
  emk_nccl *nccl;
  emk_nccl_emu *emu;           /* the stand-in's instead */
  emi_device *d;
};

static int emulated_nccl(emi_device *d) {
  return emk_dev(d)->cuda->emulated && emk_nccl_emu_on();
}

static int native(emi_device *d) { return !emk_dev(d)->cuda->emulated || emulated_nccl(d); }

static em_status coll_unique_id(unsigned char id[128], char *err, size_t errlen) {
  if (emk_nccl_emu_on()) return emk_nccl_emu_unique_id(id);
  emk_libs *L;
  em_status st = emk_libs_open(&L, err, errlen);
  if (st) return st;
  st = emk_nccl_unique_id(L, id, err, errlen);
  emk_libs_close(L);               /* libnccl stays loaded (libs.h, "Lifetime") */
  return st;
}

static em_status coll_version(int *code, char *err, size_t errlen) {
  emk_libs *L;
  *code = 0;
  em_status st = emk_libs_open(&L, err, errlen);
  if (st) return st;
  emk_lib_version v;
  if (!(st = emk_libs_version(L, EMK_LIB_NCCL, &v, err, errlen))) *code = v.code;
  emk_libs_close(L);
  return st;
}

static em_status coll_init(emi_device *d, const unsigned char id[128], int rank, int size,
                           double timeout_s, emi_collective **out, char *err,
                           size_t errlen) {
  *out = NULL;
  if (emulated_nccl(d)) {
    emi_collective *c = calloc(1, sizeof *c);
    if (!c) return emk_errf(err, errlen, EM_ERR_NOMEM, "NCCL: out of memory");
    c->d = d;
    em_status st = emk_nccl_emu_init(rt_of(d), d->index, id, rank, size, timeout_s, &c->emu,
                                     err, errlen);
    if (st) { free(c); return st; }
    *out = c;
    return EM_OK;
  }
  if (!emk_nccl_init)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "NCCL: ember was built without the "
                    "CUDA and NCCL headers");
  if (!stream_of(d, EMI_STREAM_COMM))
    return emk_errf(err, errlen, EM_ERR_DEVICE, "cuda:%d: %s", d->index, rt_of(d)->errmsg);
  emi_collective *c = calloc(1, sizeof *c);
  if (!c) return emk_errf(err, errlen, EM_ERR_NOMEM, "NCCL: out of memory");
  c->d = d;
  em_status st = emk_nccl_init(rt_of(d), d->index, id, rank, size, timeout_s, &c->nccl, err,
                               errlen);
  if (st) { free(c); return st; }
  *out = c;
  return EM_OK;
}

static em_status coll_group(emi_collective *c, int start, char *err, size_t errlen) {
  if (c->emu) return emk_nccl_emu_group(c->emu, start, err, errlen);
  return emk_nccl_group(c->nccl, start, err, errlen);
}

static em_status coll_issue(emi_collective *c, const emi_coll_call *k, char *err,
                            size_t errlen) {
  emk_stream *s = stream_of(c->d, (emi_stream)k->stream);
  if (!s) return emk_errf(err, errlen, EM_ERR_DEVICE, "NCCL: cuda:%d: no stream %d", c->d->index,
                          k->stream);
  if (c->emu)
    return emk_nccl_emu_issue(c->emu, k->kind, k->op, (em_dtype)k->dtype, k->in, k->out,
                              k->count, k->peer, s, err, errlen);
  return emk_nccl_collective(c->nccl, k->kind, k->op, (em_dtype)k->dtype, k->in, k->out,
                             k->count, k->peer, s, err, errlen);
}

static em_status coll_async_error(emi_collective *c, char *err, size_t errlen) {
  if (c->emu) return emk_nccl_emu_async_error(c->emu, err, errlen);
  return emk_nccl_async_error(c->nccl, err, errlen);
}

static void coll_free(emi_collective *c, int abort) {
  if (!c) return;
  if (c->emu) emk_nccl_emu_free(c->emu, abort);
  else if (abort) emk_nccl_abort(c->nccl);
  else emk_nccl_destroy(c->nccl);
  free(c);
}

const emi_services emk_cuda_services = {
  .props = props,
  .memory_stats = memory_stats,
  .reset_peak = reset_peak,
  .empty_cache = empty_cache,
  .synchronize = synchronize,
  .errmsg = errmsg,
  .stream_sync = stream_sync,
  .event_new = event_new,
  .event_query = event_query,
  .event_wait = event_wait,
  .event_free = event_free,
  .stream_new = stream_new,
  .stream_free = stream_free,
  .host_callback = host_callback,
  .memcpy_async = memcpy_async,
  .host_alloc = host_alloc,
  .host_free = host_free,
  .host_collect = host_collect,
  .is_pinned = emk_is_pinned,
  .copy_pinned = emk_pinned_copy_queue,
  .pool_new = pool_new,
  .pool_alloc = emk_pinned_pool_alloc,
  .pool_put = emk_pinned_pool_put,
  .pool_copying = emk_pinned_pool_copying,
  .pool_stats = emk_pinned_pool_stats,
  .pool_trim = emk_pinned_pool_trim,
  .pool_close = emk_pinned_pool_close,
  .native = native,
  .coll_unique_id = coll_unique_id,
  .coll_version = coll_version,
  .coll_init = coll_init,
  .coll_group = coll_group,
  .coll_issue = coll_issue,
  .coll_async_error = coll_async_error,
  .coll_free = coll_free,
};
