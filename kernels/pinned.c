/*
** pinned.c -- pinned (page-locked) host tensors, and the asynchronous copy
** from them to a device on its copy stream.
**
** Why. A copy from ordinary (pageable) host memory must be staged: the backend
** snapshots the source before returning, so the caller may change it at once
** (backend.c, to_device). A pinned tensor's memory comes from the runtime's
** host_alloc, which the device can read by itself, so the copy needs no staging
** and the host does not wait: t:pin_memory():cuda() costs the host a queue
** entry. The price, as with PyTorch's non_blocking copies: the pinned tensor
** must not be written until the copy ran.
**
** The copy stream. Each device has a compute stream, where every op runs in
** call order, and a copy stream. A pinned copy into a fresh destination (the
** usual `:cuda()`, which made `out` just now) runs on the copy stream, so the
** transfer of the next batch overlaps the compute of this one:
**   1. the destination block is taken from the allocator *for the copy stream*:
**      per-stream bins give it only memory the copy stream itself freed, so no
**      kernel still queued on the compute stream can be reading it;
**   2. the copy is queued on the copy stream, and a host callback after it lets
**      go of the pinned source (which the copy held a reference to);
**   3. the compute stream waits for an event recorded after the copy, so the
**      ops that read the tensor run after its data arrived;
**   4. the block is recorded as used on the compute stream (before anything is
**      queued), so its release waits for the compute stream too (alloc.h,
**      emk_alloc_record_stream);
**   5. the block replaces the one the caller allocated for out (untouched yet,
**      given back at once).
** Any other pinned copy (into a view, a strided or other-dtype destination)
** runs on the compute stream, still without staging. The loader's device feed
** (core/data/feed.c) takes steps 1, 2, 4 and 5 at once (the services' copy_pinned,
** emk_pinned_copy_queue) and step 3 only when it hands the batch out, so a batch
** copied ahead does not make the ops of the step before it wait.
**
** The loader's pool. A loader with pin_memory assembles batches straight into
** pinned memory (em_loader_config.buffer_alloc), from a pool of buffers kept
** for the loader's life, so the runtime is asked for pinned memory only while
** the pool grows (its first batches). A buffer comes back to the pool when its
** tensor's last reference goes: for a batch sent to a device, that is the host
** callback after its copy (step 2), so a buffer is never handed to a worker
** while a copy still reads it. A worker that finds no free buffer makes a new
** one until the pool holds what the pipeline needs (the loader's prefetch, its
** workers and the batches copied ahead, per field); past that it waits while
** some buffer's copy is pending (that one comes back by itself): copies that
** lag behind then hold the workers back instead of growing the pool. With no
** copy pending it grows anyway, since waiting on buffers the consumer holds
** could deadlock.
*/
#include "cuda.h"

/* Freeing. The last reference to a pinned tensor is often dropped on a
** stream's thread, by the callback that ends a copy's hold on it, where the
** runtime must not be called (CUDA forbids API calls in host functions). So
** the block is only put on the state's list of dead pinned blocks (linked
** through their first bytes: every block has room, see MIN_BLOCK), and given
** back to the runtime by the next pin_memory, synchronize or close. */
enum { MIN_BLOCK = 16 };

static void pinned_free(void *ud, void *p, size_t nbytes) {
  (void)nbytes;
  emk_cuda *c = ud;
  pthread_mutex_lock(&c->pinned_mu);
  *(void **)p = c->pinned_dead;
  c->pinned_dead = p;
  pthread_mutex_unlock(&c->pinned_mu);
}

void emk_pinned_collect(emk_cuda *c) {
  pthread_mutex_lock(&c->pinned_mu);
  void *p = c->pinned_dead;
  c->pinned_dead = NULL;
  pthread_mutex_unlock(&c->pinned_mu);
  while (p) {
    void *next = *(void **)p;
    c->rt->ops->host_free(c->rt, p);
    p = next;
  }
}

int emk_is_pinned(const em_tensor *t) {
  return t && t->device == EM_CPU &&
         (t->storage->ext_free == pinned_free || t->storage->ext_free == emk_pinned_pool_put);
}

/* t: a CPU tensor (core checked it); ctx: the state's CUDA context. */
em_status emk_pin_memory(em_state *S, void *ctx, const em_tensor *t, em_tensor **out) {
  em_status st;
  if (emk_is_pinned(t)) {
    em_tensor_retain((em_tensor *)t);
    *out = (em_tensor *)t;
    return EM_OK;
  }
  emk_cuda *c = ctx;
  emk_pinned_collect(c);
  size_t nbytes = (size_t)t->numel * em_dtype_size(t->dtype);
  void *p = NULL;
  if ((st = c->rt->ops->host_alloc(c->rt, nbytes < MIN_BLOCK ? MIN_BLOCK : nbytes, &p)))
    return emi_error(S, st, "pin_memory: %s", c->rt->errmsg);
  em_tensor *r = emi_tensor_try_external(S, p, nbytes, pinned_free, c, t->sizes, t->ndim,
                                         t->dtype);
  if (!r) {
    c->rt->ops->host_free(c->rt, p);
    return emi_error(S, EM_ERR_NOMEM, "pin_memory: out of memory");
  }
  emi_device *cpu = emi_cpu_device(S);
  if (nbytes && (st = cpu->backend->copy(cpu, r, t))) {
    em_tensor_release(r);
    return st;
  }
  *out = r;
  return EM_OK;
}

static void release_tensor(void *ud) { em_tensor_release(ud); }

/* out can take a new block when it is the whole of a storage nobody else holds. */
static int replaceable(const em_tensor *out) {
  const emi_storage *st = out->storage;
  return em_tensor_is_contiguous(out) && out->offset == 0 &&
         __atomic_load_n(&st->refcount, __ATOMIC_ACQUIRE) == 1 &&
         st->nbytes == (size_t)out->numel * em_dtype_size(out->dtype);
}

/* The pinned source's bytes to out on stream s, the source kept alive until
** the copy ran. */
static em_status queue_copy(emk_cuda_device *cd, void *dst, em_tensor *src, emk_stream *s) {
  emk_runtime *rt = cd->cuda->rt;
  size_t n = (size_t)src->numel * em_dtype_size(src->dtype);
  em_status st = rt->ops->memcpy_async(rt, dst, em_tensor_data(src), n, EMK_HOST_TO_DEVICE,
                                       s);
  if (st) return st;
  em_tensor_retain(src);
  if (rt->ops->host_callback(rt, s, release_tensor, src)) {
    rt->ops->stream_sync(rt, s);       /* can't hand it to the stream: wait instead */
    em_tensor_release(src);
  }
  return EM_OK;
}

em_status emk_pinned_copy_queue(emi_device *d, em_tensor *out, const em_tensor *src,
                                int *on_copy) {
  emk_cuda_device *cd = emk_dev(d);
  emk_cuda *c = cd->cuda;
  em_tensor *s = (em_tensor *)src;
  char err[EMK_ERRMSG_SIZE];
  *on_copy = 0;
  if (!replaceable(out)) {             /* on the compute stream, in call order */
    em_status st = queue_copy(cd, em_tensor_data(out), s, cd->compute);
    return st ? emk_error(d, "copy to device", st) : EM_OK;
  }
  size_t n = out->storage->nbytes;
  void *p = NULL;
  em_status st = emk_alloc_malloc(c->alloc, cd->index, n, cd->copy, &p, err, sizeof err);
  if (st) return emi_error(d->S, st, "copy to device: %s", err);
  if (emk_alloc_record_stream(c->alloc, p, cd->compute, err, sizeof err)) {
    /* its release could not wait for the compute stream: use out's own block */
    emk_alloc_release(c->alloc, p, err, sizeof err);
    st = queue_copy(cd, em_tensor_data(out), s, cd->compute);
    return st ? emk_error(d, "copy to device", st) : EM_OK;
  }
  if ((st = queue_copy(cd, p, s, cd->copy))) {
    emk_alloc_release(c->alloc, p, err, sizeof err);   /* nothing was queued */
    return emk_error(d, "copy to device", st);
  }
  emk_alloc_release(c->alloc, out->storage->data, err, sizeof err);
  out->storage->data = p;
  *on_copy = 1;
  return EM_OK;
}

em_status emk_copy_from_pinned(emi_device *d, em_tensor *out, const em_tensor *src) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  emk_pinned_collect(cd->cuda);        /* the host thread: free what died */
  int on_copy = 0;
  em_status st = emk_pinned_copy_queue(d, out, src, &on_copy);
  if (st || !on_copy) return st;
  emk_event *e = NULL;
  if ((st = rt->ops->event_create(rt, cd->index, &e)) ||
      (st = rt->ops->event_record(rt, e, cd->copy)) ||
      (st = rt->ops->stream_wait_event(rt, cd->compute, e))) {
    rt->ops->stream_sync(rt, cd->copy);      /* the data is there: nothing to order */
    if (e) rt->ops->event_destroy(rt, e);
    return emk_error(d, "copy to device", st);
  }
  rt->ops->event_destroy(rt, e);             /* the queued wait keeps its point */
  return EM_OK;
}

/* -- The loader's pool of pinned buffers ---------------------------------------------
** Runs on worker threads (alloc), on streams' threads (put, from the callback
** that ends a copy: no runtime call there, only the lock and the dead list) and
** on the host thread (copying, close, stats). */
enum { POOL_MAX = 256, POOL_ALIGN = 256 };

typedef struct pool_buf {
  void *p;
  size_t cap;
  int busy;                      /* held by a tensor */
  int copying;                   /* and a queued copy reads it */
} pool_buf;

struct emi_pinned_pool {
  em_state *S;
  emk_cuda *c;
  pthread_mutex_t mu;
  pthread_cond_t back;           /* a copying buffer came back */
  pool_buf buf[POOL_MAX];
  int n, busy, copying, closed;
  int target;                    /* buffers the pipeline needs: past it, wait */
  int growing;                   /* being allocated now (counted against target) */
  size_t bytes;
  int64_t waits;
  double wait_s;
};

em_status emk_pinned_pool_new(em_state *S, emk_cuda *c, int target, emk_pinned_pool **out) {
  emk_pinned_pool *pl = emi_malloc(S, sizeof *pl);
  if (!(*out = pl)) return emi_error(S, EM_ERR_NOMEM, "loader: out of memory");
  memset(pl, 0, sizeof *pl);
  pl->S = S;
  pl->c = c;
  pl->target = target < 1 ? 1 : target > POOL_MAX ? POOL_MAX : target;
  pthread_mutex_init(&pl->mu, NULL);
  pthread_cond_init(&pl->back, NULL);
  return EM_OK;
}

static void pool_destroy(emk_pinned_pool *pl) {
  pthread_mutex_destroy(&pl->mu);
  pthread_cond_destroy(&pl->back);
  emi_free(pl->S, pl, sizeof *pl);
}

/* The smallest free buffer of at least n bytes, or -1. Under the lock. */
static int pool_fit(emk_pinned_pool *pl, size_t n) {
  int best = -1;
  for (int i = 0; i < pl->n; i++)
    if (!pl->buf[i].busy && pl->buf[i].cap >= n && (best < 0 || pl->buf[i].cap < pl->buf[best].cap))
      best = i;
  return best;
}

void *emk_pinned_pool_alloc(void *ud, size_t n) {
  emk_pinned_pool *pl = ud;
  emk_runtime *rt = pl->c->rt;
  size_t cap = ((n < MIN_BLOCK ? MIN_BLOCK : n) + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
  pthread_mutex_lock(&pl->mu);
  int i;
  double t0 = 0;
  while ((i = pool_fit(pl, n)) < 0 && pl->copying > 0 && pl->n + pl->growing >= pl->target) {
    if (t0 == 0) { t0 = emi_now(); pl->waits++; }
    pthread_cond_wait(&pl->back, &pl->mu);
  }
  if (t0 != 0) pl->wait_s += emi_now() - t0;
  if (i >= 0) {
    pl->buf[i].busy = 1;
    pl->busy++;
    pthread_mutex_unlock(&pl->mu);
    return pl->buf[i].p;
  }
  if (pl->n + pl->growing >= pl->target)   /* a free buffer too small (a last batch's) */
    for (int k = 0; k < pl->n; k++)   /* makes room: to the dead list, no runtime call */
      if (!pl->buf[k].busy) {
        pinned_free(pl->c, pl->buf[k].p, pl->buf[k].cap);
        pl->bytes -= pl->buf[k].cap;
        pl->buf[k] = pl->buf[--pl->n];
        break;
      }
  pl->growing++;
  pthread_mutex_unlock(&pl->mu);
  /* Grow: the runtime is asked only here (CUDA allows it on any thread). */
  void *p = NULL;
  em_status st = rt->ops->host_alloc(rt, cap, &p);
  pthread_mutex_lock(&pl->mu);
  pl->growing--;
  if (st) {
    pthread_mutex_unlock(&pl->mu);
    return NULL;
  }
  if (pl->n < POOL_MAX) {
    pl->buf[pl->n++] = (pool_buf){p, cap, 1, 0};
    pl->bytes += cap;
  }                                /* else a block of its own, given back when it dies */
  pl->busy++;
  pthread_mutex_unlock(&pl->mu);
  return p;
}

static int pool_find(emk_pinned_pool *pl, const void *p) {
  for (int i = 0; i < pl->n; i++)
    if (pl->buf[i].p == p) return i;
  return -1;
}

void emk_pinned_pool_put(void *ud, void *p, size_t nbytes) {
  emk_pinned_pool *pl = ud;
  pthread_mutex_lock(&pl->mu);
  int i = pool_find(pl, p);
  if (i >= 0) {
    if (pl->buf[i].copying) { pl->copying--; pl->buf[i].copying = 0; }
    pl->buf[i].busy = 0;
    if (pl->closed) {              /* the loader is gone: back to the runtime */
      pinned_free(pl->c, p, nbytes);
      pl->bytes -= pl->buf[i].cap;
      pl->buf[i] = pl->buf[--pl->n];
    }
  } else {
    pinned_free(pl->c, p, nbytes); /* a block past POOL_MAX */
  }
  int last = --pl->busy == 0 && pl->closed;
  pthread_cond_broadcast(&pl->back);
  pthread_mutex_unlock(&pl->mu);
  if (last) pool_destroy(pl);
}

void emk_pinned_pool_copying(emk_pinned_pool *pl, const void *p) {
  pthread_mutex_lock(&pl->mu);
  int i = pool_find(pl, p);
  if (i >= 0 && pl->buf[i].busy && !pl->buf[i].copying) {
    pl->buf[i].copying = 1;
    pl->copying++;
  }
  pthread_mutex_unlock(&pl->mu);
}

void emk_pinned_pool_stats(emk_pinned_pool *pl, int64_t *buffers, int64_t *bytes,
                           int64_t *waits, double *wait_s) {
  pthread_mutex_lock(&pl->mu);
  *buffers = pl->n;
  *bytes = (int64_t)pl->bytes;
  *waits = pl->waits;
  *wait_s = pl->wait_s;
  pthread_mutex_unlock(&pl->mu);
}

/* Gives the free buffers back to the runtime (through the dead list, then at
** once: this is the host thread). Under the lock. */
static void pool_trim_locked(emk_pinned_pool *pl) {
  for (int i = 0; i < pl->n;) {
    if (pl->buf[i].busy) { i++; continue; }
    pinned_free(pl->c, pl->buf[i].p, pl->buf[i].cap);
    pl->bytes -= pl->buf[i].cap;
    pl->buf[i] = pl->buf[--pl->n];
  }
}

void emk_pinned_pool_trim(emk_pinned_pool *pl) {
  pthread_mutex_lock(&pl->mu);
  pool_trim_locked(pl);
  pthread_mutex_unlock(&pl->mu);
  emk_pinned_collect(pl->c);
}

void emk_pinned_pool_close(emk_pinned_pool *pl) {
  if (!pl) return;
  emk_cuda *c = pl->c;
  pthread_mutex_lock(&pl->mu);
  pl->closed = 1;
  pool_trim_locked(pl);            /* free buffers go now, busy ones when they die */
  int last = pl->busy == 0;
  pthread_mutex_unlock(&pl->mu);
  if (last) pool_destroy(pl);
  emk_pinned_collect(c);
}
