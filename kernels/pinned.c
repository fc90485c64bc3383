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
** runs on the compute stream, still without staging.
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
  return t && t->device == EM_CPU && t->storage->ext_free == pinned_free;
}

int em_tensor_is_pinned(const em_tensor *t) { return emk_is_pinned(t); }

em_status em_tensor_pin_memory(em_state *S, const em_tensor *t, em_tensor **out) {
  *out = NULL;
  em_status st = emi_check_tensor(S, "pin_memory", t);
  if (st) return st;
  if (t->device != EM_CPU) {
    char b[16];
    return emi_error(S, EM_ERR_DEVICE, "pin_memory: the tensor is on %s; only CPU "
                     "tensors can be pinned", emi_device_name(b, t->device));
  }
  if (emk_is_pinned(t)) {
    em_tensor_retain((em_tensor *)t);
    *out = (em_tensor *)t;
    return EM_OK;
  }
  emi_device_attach(S, 0);
  emk_cuda *c = S->cuda;
  if (!c) return emi_error(S, EM_ERR_DEVICE, "pin_memory: %s", S->cuda_why);
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
  if (nbytes && (st = S->cpu.backend->copy(&S->cpu, r, t))) {
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

em_status emk_copy_from_pinned(emi_device *d, em_tensor *out, const em_tensor *src) {
  emk_cuda_device *cd = emk_dev(d);
  emk_cuda *c = cd->cuda;
  emk_runtime *rt = c->rt;
  em_tensor *s = (em_tensor *)src;
  char err[EMK_ERRMSG_SIZE];
  emk_pinned_collect(c);               /* the host thread: free what died */
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
  emk_event *e = NULL;
  if ((st = queue_copy(cd, p, s, cd->copy)) ||
      (st = rt->ops->event_create(rt, cd->index, &e)) ||
      (st = rt->ops->event_record(rt, e, cd->copy)) ||
      (st = rt->ops->stream_wait_event(rt, cd->compute, e))) {
    rt->ops->stream_sync(rt, cd->copy);      /* nothing of it may still run */
    if (e) rt->ops->event_destroy(rt, e);
    emk_alloc_release(c->alloc, p, err, sizeof err);
    return emk_error(d, "copy to device", st);
  }
  rt->ops->event_destroy(rt, e);             /* the queued wait keeps its point */
  emk_alloc_release(c->alloc, out->storage->data, err, sizeof err);
  out->storage->data = p;
  return EM_OK;
}
