/*
** backend.c -- the CUDA backend's op table (emi_backend, core/backend.h) for
** devices cuda:0 .. N-1: storages through the caching allocator, copies (host to
** device, device to host, within and between devices) here, and every other
** entry from the kernel files (k_*.c, the launchers of the device code in
** k_*.cu) and the libraries (cuBLASLt, cuDNN).
**
** Streams. Every op of a state on a device is queued on that device's compute
** stream, so they run in call order and the host does not wait. Memory freed by
** a tensor goes back to the allocator at once: the allocator hands it out again
** only to work on the same stream, which runs after whatever still used it.
** A copy to the host waits for the stream (the host is about to read); a copy
** from the host keeps the host tensor alive until the stream has read it.
*/
#include "cuda.h"
#include "k_elementwise.h"
#include "k_reduce.h"
#include "k_index.h"
#include "k_random.h"
#include "dnn.h"
#include "k_optim.h"
#include "k_loss.h"
#include "k_norm.h"
#include "k_sort.h"
#include <stdio.h>

/* -- Storages ---------------------------------------------------------------------- */

static emi_storage *cuda_alloc(emi_device *d, size_t nbytes) {
  em_state *S = d->S;
  emk_cuda_device *cd = emk_dev(d);
  emi_storage *st = emi_malloc(S, sizeof *st);
  if (!st) return NULL;
  memset(st, 0, sizeof *st);
  void *p = NULL;
  char err[EMK_ERRMSG_SIZE];
  if (nbytes && emk_alloc_malloc(cd->cuda->alloc, cd->index, nbytes, cd->compute, &p, err,
                                 sizeof err)) {
    emi_alloc_failed(S, err);                      /* emi_tensor_new says it */
    emi_free(S, st, sizeof *st);
    return NULL;
  }
  st->data = p;
  st->nbytes = nbytes;
  st->block_size = sizeof *st;
  if (cd->capture) emk_graph_keep(cd, st);          /* the graph may keep it (graph.c) */
  return st;
}

/* While capturing a graph, a storage that dies is the graph's to free. */
static void cuda_free(emi_device *d, emi_storage *st) {
  emk_cuda_device *cd = emk_dev(d);
  if (cd->capture && emk_graph_take_dead(cd, st)) return;
  emk_storage_free(d, st);
}

void emk_storage_free(emi_device *d, emi_storage *st) {
  emk_cuda_device *cd = emk_dev(d);
  char err[EMK_ERRMSG_SIZE];
  emk_alloc_release(cd->cuda->alloc, st->data, err, sizeof err);  /* reported by the
                                                                      stream's next sync */
  emi_free(d->S, st, sizeof *st);
}

/* -- Copies -------------------------------------------------------------------------- */

static int plain(const em_tensor *t) {      /* contiguous, nothing expanded */
  return em_tensor_is_contiguous(t);
}

static void release_tensor(void *ud) { em_tensor_release(ud); }

/* A private contiguous CPU copy of src as dt: the stream reads it later, so the
** caller may change src as soon as the call returns (as CUDA stages a copy from
** pageable memory before returning). Pinned sources skip this (pinned.c). */
static em_status host_snapshot(em_state *S, const em_tensor *src, em_dtype dt,
                               em_tensor **out) {
  em_status st = emi_tensor_new(S, "copy", src->sizes, src->ndim, dt, EM_CPU, out);
  if (st) return st;
  emi_device *cpu = emi_cpu_device(S);
  if ((st = cpu->backend->copy(cpu, *out, src))) em_tensor_release(*out);
  return st;
}

static em_status to_device(emi_device *d, em_tensor *out, const em_tensor *src) {
  em_state *S = d->S;
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  if (!cd->capture && emk_is_pinned(src) && plain(src) && plain(out) && src->dtype == out->dtype)
    return emk_copy_from_pinned(d, out, src);      /* no staging, no wait (pinned.c) */
  em_tensor *h = NULL, *stage = NULL;
  em_status st = host_snapshot(S, src, out->dtype, &h);
  if (st) return st;
  em_tensor *dst = out;        /* a strided destination is filled from a staged copy */
  if (!plain(out)) {
    if ((st = emi_tensor_new(S, "copy", out->sizes, out->ndim, out->dtype, d->index,
                             &stage))) {
      em_tensor_release(h);
      return st;
    }
    dst = stage;
  }
  size_t n = (size_t)h->numel * em_dtype_size(h->dtype);
  if (cd->capture) {           /* a constant of the graph being captured (graph.c) */
    st = emk_graph_upload(d, em_tensor_data(dst), em_tensor_data(h), n);
    em_tensor_release(h);
    if (!st && stage) st = emk_copy_same_dtype(d, out, stage);
    em_tensor_release(stage);
    return st;
  }
  st = rt->ops->memcpy_async(rt, em_tensor_data(dst), em_tensor_data(h), n,
                             EMK_HOST_TO_DEVICE, cd->compute);
  /* the stream reads h later, so the stream lets go of it; if it can't take it,
  ** wait here instead */
  if (st || rt->ops->host_callback(rt, cd->compute, release_tensor, h)) {
    rt->ops->stream_sync(rt, cd->compute);
    em_tensor_release(h);
  }
  if (st) st = emk_error(d, "copy to device", st);
  if (!st && stage) st = emk_copy_same_dtype(d, out, stage);
  em_tensor_release(stage);    /* its memory is reused only by later work on the stream */
  return st;
}

static em_status to_host(emi_device *d, em_tensor *out, const em_tensor *src) {
  em_state *S = d->S;
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  em_tensor *dsrc = (em_tensor *)src, *stage = NULL, *h = NULL;
  em_status st = EM_OK;
  if (!plain(src)) {             /* gather on the device first */
    if ((st = emi_tensor_new(S, "copy", src->sizes, src->ndim, src->dtype, d->index, &stage)) ||
        (st = emk_copy_same_dtype(d, stage, src)))
      goto done;
    dsrc = stage;
  }
  int direct = out->dtype == src->dtype && plain(out);
  if (direct) h = out;
  else if ((st = emi_tensor_new(S, "copy", src->sizes, src->ndim, src->dtype, EM_CPU, &h)))
    goto done;
  if ((st = rt->ops->memcpy_async(rt, em_tensor_data(h), em_tensor_data(dsrc),
                                  (size_t)dsrc->numel * em_dtype_size(dsrc->dtype),
                                  EMK_DEVICE_TO_HOST, cd->compute)) ||
      (st = rt->ops->stream_sync(rt, cd->compute))) {
    st = emk_error(d, "copy to host", st);
    goto done;
  }
  if (!direct) st = emi_cpu_device(S)->backend->copy(emi_cpu_device(S), out, h);
done:
  if (h != out) em_tensor_release(h);
  em_tensor_release(stage);
  return st;
}

/* Work queued on `later` from now on runs after what was queued on `first`
** so far (an event of first's device, recorded, waited for, destroyed: a
** wait already queued keeps its point). */
static em_status order_after(emk_cuda *c, int first_dev, emk_stream *first,
                             emk_stream *later) {
  emk_runtime *rt = c->rt;
  emk_event *e = NULL;
  em_status st = rt->ops->event_create(rt, first_dev, &e);
  if (!st) st = rt->ops->event_record(rt, e, first);
  if (!st) st = rt->ops->stream_wait_event(rt, later, e);
  if (e) rt->ops->event_destroy(rt, e);
  return st;
}

/* Between two devices. The copy runs on the destination's compute stream, after
** the source's stream has computed src (an event), and the source's stream
** then waits for the copy, so memory src frees is reused only after the copy
** read it. A strided source is gathered on its own device first; a strided or
** other-dtype destination is filled on its device from a contiguous stage. */
static em_status peer_copy(em_state *S, em_tensor *out, const em_tensor *src) {
  emk_cuda *c = emk_ctx(S);
  emk_cuda_device *sd = c->dev[src->device];
  emk_cuda_device *dd = c->dev[out->device];
  emk_runtime *rt = c->rt;
  em_tensor *from = (em_tensor *)src, *gathered = NULL, *to = out, *stage = NULL;
  em_status st = EM_OK;
  if (!plain(src)) {
    if ((st = emi_tensor_new(S, "copy", src->sizes, src->ndim, src->dtype, src->device,
                             &gathered)) ||
        (st = emk_copy_same_dtype(&sd->base, gathered, src)))
      goto done;
    from = gathered;
  }
  if (!plain(out) || out->dtype != src->dtype) {
    if ((st = emi_tensor_new(S, "copy", src->sizes, src->ndim, src->dtype, out->device,
                             &stage)))
      goto done;
    to = stage;
  }
  if ((st = order_after(c, sd->index, sd->compute, dd->compute)) ||
      (st = rt->ops->memcpy_peer_async(rt, em_tensor_data(to), dd->index,
                                       em_tensor_data(from), sd->index,
                                       (size_t)from->numel * em_dtype_size(from->dtype),
                                       dd->compute)) ||
      (st = order_after(c, dd->index, dd->compute, sd->compute))) {
    /* the streams can't be ordered: wait for both instead, so nothing is
    ** reused early (the error is still reported) */
    rt->ops->stream_sync(rt, sd->compute);
    rt->ops->stream_sync(rt, dd->compute);
    st = emk_error(&dd->base, "copy between devices", st);
    goto done;
  }
  if (stage)
    st = out->dtype != src->dtype ? emk_cast(&dd->base, out, stage)
                                  : emk_copy_same_dtype(&dd->base, out, stage);
done:
  em_tensor_release(gathered);
  em_tensor_release(stage);
  return st;
}

/* A copy to the host or between devices can't be captured in a graph (one from
** the host can: it becomes the graph's constant, in to_device). */
static em_status refuse_in_graph(em_state *S, em_tensor *out, const em_tensor *src) {
  int devs[2] = {out->device, src->device};
  for (int i = 0; i < 2; i++) {
    if (devs[i] < 0) continue;
    emi_device *x = &emk_ctx(S)->dev[devs[i]]->base;
    if (emk_dev(x)->capture && src->device != EM_CPU)   /* from the CPU: to_device */
      return emk_graph_refuse(x, "copy", out->device == EM_CPU
                              ? "a copy to the CPU (reading values)"
                              : "a copy between devices");
  }
  return EM_OK;
}

static em_status cuda_copy(emi_device *d, em_tensor *out, const em_tensor *src) {
  if (out->numel == 0) return EM_OK;
  if (out->device != src->device) {
    em_status st = refuse_in_graph(d->S, out, src);
    if (st) return st;
  }
  if (src->device == EM_CPU) return to_device(d, out, src);
  if (out->device == EM_CPU) return to_host(d, out, src);
  if (out->device != src->device) return peer_copy(d->S, out, src);
  if (out->dtype != src->dtype) return emk_cast(d, out, src);  /* k_elementwise.c */
  return emk_copy_same_dtype(d, out, src);
}

static em_status cuda_fill(emi_device *d, em_tensor *out, double value) {
  return emk_fill(d, out, value);
}

const emi_backend emk_cuda_backend = {
  .name = "cuda",
  .id = EMI_BACKEND_CUDA,
  .nhwc = EMI_NHWC_CONV | EMI_NHWC_POOL | EMI_NHWC_BN,   /* cuDNN's NHWC descriptors;
                                                          k_pool.cu; k_dnn.c/.cu */
  .alloc = cuda_alloc,
  .free = cuda_free,
  .copy = cuda_copy,
  .fill = cuda_fill,
  .unary = emk_unary,                 /* k_elementwise.c */
  .binary = emk_binary,
  .binary_scalar = emk_binary_scalar,
  .add_scaled = emk_add_scaled,
  .clamp = emk_clamp,
  .where = emk_where,
  .reduce = emk_reduce,                /* k_reduce.c */
  .var = emk_var,
  .norm = emk_norm,
  .arg_reduce = emk_arg_reduce,
  .softmax = emk_softmax,
  .matmul = emk_matmul,                /* k_matmul.c */
  .index_select = emk_index_select,   /* k_index.c */
  .gather = emk_gather,
  .index_add = emk_index_add,
  .scatter_add = emk_scatter_add,
  .uniform = emk_uniform,             /* k_random.c */
  .normal = emk_normal,
  .randint = emk_randint,
  .arange = emk_arange,
  .conv2d = emk_conv2d,               /* k_dnn.c */
  .conv2d_backward = emk_conv2d_backward,
  .max_pool2d = emk_max_pool2d,          /* k_pool.c */
  .max_pool2d_backward = emk_max_pool2d_backward,
  .avg_pool2d = emk_avg_pool2d,
  .avg_pool2d_backward = emk_avg_pool2d_backward,
  .adaptive_avg_pool2d = emk_adaptive_avg_pool2d,
  .adaptive_avg_pool2d_backward = emk_adaptive_avg_pool2d_backward,
  .batch_norm = emk_batch_norm,
  .batch_norm_backward = emk_batch_norm_backward,
  .sgd_step_multi = emk_sgd_step_multi,   /* k_optim.c */
  .adam_step_multi = emk_adam_step_multi,
  .norm_multi = emk_norm_multi,
  .scale_multi = emk_scale_multi,
  .layer_norm = emk_layer_norm,       /* k_norm.c */
  .layer_norm_backward = emk_layer_norm_backward,
  .cross_entropy = emk_cross_entropy, /* k_loss.c */
  .cross_entropy_backward = emk_cross_entropy_backward,
  .nll_loss = emk_nll_loss,
  .nll_loss_backward = emk_nll_loss_backward,
  .pointwise_loss = emk_pointwise_loss,
  .pointwise_loss_backward = emk_pointwise_loss_backward,
  .sort = emk_sort,                   /* k_sort.c */
  .scan = emk_scan,
};
