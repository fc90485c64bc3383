/*
** runtime_real.c -- the real device runtime (runtime.h's table on the CUDA runtime):
** the object, devices, memory, streams, events and copies. Kernels are in
** launch_real.c, gemm (cuBLASLt) in gemm_real.c, their shared state in real.h.
**
** The design, in the few places where it is not a one-to-one call:
**   - Nothing of CUDA is linked: cudart (and cuBLASLt at the first gemm) come
**     from libs.c's dlopen'ed tables, so a CPU-only machine still loads ember, and
**     emk_real_open there fails cleanly (EM_ERR_DEVICE, "no CUDA driver ...").
**   - Any thread may call any entry, and CUDA's current device is per thread: so
**     every entry first sets the device its object belongs to (a stream's, an
**     event's, the dev argument). Streams and events remember their device.
**     Pinned host memory belongs to none (it is portable), but CUDA pins it
**     through the calling thread's context: host_alloc and host_free set the
**     first device that got a context (R->home), so a loader's worker thread,
**     whose current device is CUDA's default 0, makes no context on cuda:0 for
**     a state that works on cuda:3.
**   - Errors carry CUDA's own words and the entry: "stream_sync (cuda:1):
**     cudaStreamSynchronize: cudaErrorIllegalAddress: an illegal memory access
**     was encountered". Asynchronous failures need no bookkeeping here: CUDA
**     returns them from the next synchronising call, which is runtime.h's sticky
**     error contract. (Unlike the emulator, a real device whose kernel faulted has
**     a broken context: every later call fails too, and the process must restart.)
**   - Streams are non-blocking (cudaStreamNonBlocking: no implicit ordering with
**     the legacy default stream that other libraries may use); events are made
**     without timing (cheaper record and wait). Pinned host memory is portable
**     (page-locked for every device). Live streams and events are kept in lists
**     so that close can release what a caller forgot.
**   - Nothing here exits or aborts, and nothing touches a device before a call
**     asks for it: open only counts devices, and device_props reads
**     cudaGetDeviceProperties, which needs no context (cudaSetDevice makes the
**     primary context since CUDA 12, cudaMemGetInfo needs one). emr_use, the
**     one way an entry reaches a device, records it in R->contexts.
** Built without the CUDA headers, emk_real_open alone is compiled and says so
** (with emk_real_contexts, which has nothing to record).
*/
#include "libs_fn.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EMK_HAVE_CUDART_H
#include "../runtime.h"
unsigned emk_real_contexts(emk_runtime *rt) { (void)rt; return 0; }

em_status emk_real_open(emk_runtime **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  snprintf(err, errlen, "CUDA runtime: ember was built without the CUDA headers (no "
           "cuda_runtime_api.h at build time)");
  return EM_ERR_DEVICE;
}
#else
#include "real.h"
#include "../dnn.h"

static const emk_runtime_ops real_ops;

static emr *emr_of(emk_runtime *rt) {
  return rt && rt->ops == &real_ops ? (emr *)rt->impl : NULL;
}

em_status emr_fail(emr *R, em_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&R->err_mu);
  vsnprintf(R->rt.errmsg, sizeof R->rt.errmsg, fmt, ap);
  pthread_mutex_unlock(&R->err_mu);
  va_end(ap);
  return code;
}

static em_status code_of(cudaError_t e) {
  switch (e) {
  case cudaErrorMemoryAllocation: return EM_ERR_NOMEM;
  case cudaErrorInvalidValue:
  case cudaErrorInvalidDevicePointer:
  case cudaErrorInvalidResourceHandle:
  case cudaErrorInvalidConfiguration:
  case cudaErrorInvalidPitchValue:
  case cudaErrorInvalidMemcpyDirection: return EM_ERR_ARG;
  default: return EM_ERR_DEVICE;
  }
}

em_status emr_cuda(emr *R, cudaError_t e, const char *entry, int dev, const char *call) {
  (void)R->f->cudaGetLastError();
  return emr_fail(R, code_of(e), "%s (cuda:%d): %s: %s: %s", entry, dev, call,
                  R->f->cudaGetErrorName(e), R->f->cudaGetErrorString(e));
}

em_status emr_use(emr *R, int dev, const char *entry) {
  if (dev < 0 || dev >= R->ndev)
    return emr_fail(R, EM_ERR_DEVICE, "%s: no device cuda:%d (this machine has %d)", entry,
                    dev, R->ndev);
  cudaError_t e = R->f->cudaSetDevice(dev);
  if (e != cudaSuccess) return emr_cuda(R, e, entry, dev, "cudaSetDevice");
  if (!(__atomic_load_n(&R->contexts, __ATOMIC_RELAXED) & (1u << dev))) {
    __atomic_fetch_or(&R->contexts, 1u << dev, __ATOMIC_RELAXED);
    int none = -1;
    __atomic_compare_exchange_n(&R->home, &none, dev, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  }
  return EM_OK;
}

/* Pinned memory's context: the first device that got one (none yet: the
** thread's own, cuda:0 unless it chose another). */
static em_status use_home(emr *R, const char *entry) {
  int h = __atomic_load_n(&R->home, __ATOMIC_RELAXED);
  return h >= 0 ? emr_use(R, h, entry) : EM_OK;
}

em_status emr_check_stream(emr *R, emk_stream *s, const char *entry) {
  if (!s) return emr_fail(R, EM_ERR_ARG, "%s: no stream (NULL)", entry);
  if (s->magic != EMR_STREAM_MAGIC)
    return emr_fail(R, EM_ERR_ARG, "%s: %p is not a live stream", entry, (void *)s);
  return emr_use(R, s->dev, entry);
}

static em_status check_event(emr *R, emk_event *e, const char *entry) {
  if (!e) return emr_fail(R, EM_ERR_ARG, "%s: no event (NULL)", entry);
  if (e->magic != EMR_EVENT_MAGIC)
    return emr_fail(R, EM_ERR_ARG, "%s: %p is not a live event", entry, (void *)e);
  return emr_use(R, e->dev, entry);
}

/* Returns from the entry with CUDA's error, naming the call. */
#define CALLN(R, entry, dev, name, expr) do { \
    cudaError_t e_ = (expr); \
    if (e_ != cudaSuccess) return emr_cuda((R), e_, (entry), (dev), (name)); \
  } while (0)

/* -- Devices --------------------------------------------------------------------------- */

static int real_device_count(emk_runtime *rt) {
  emr *R = emr_of(rt);
  return R ? R->ndev : 0;
}

static em_status real_device_props(emk_runtime *rt, int dev, emk_device_props *out) {
  emr *R = emr_of(rt);
  if (!out) return emr_fail(R, EM_ERR_ARG, "device_props: no output (NULL)");
  memset(out, 0, sizeof *out);
  if (dev < 0 || dev >= R->ndev)          /* no cudaSetDevice: it would make a context */
    return emr_fail(R, EM_ERR_DEVICE, "device_props: no device cuda:%d (this machine has %d)",
                    dev, R->ndev);
  struct cudaDeviceProp p;
  memset(&p, 0, sizeof p);
  CALLN(R, "device_props", dev, "cudaGetDeviceProperties", R->f->cudaGetDeviceProperties(&p, dev));
  snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof out->name - 1, p.name);
  out->major = p.major;
  out->minor = p.minor;
  out->multiprocessors = p.multiProcessorCount;
  out->warp_size = p.warpSize;
  out->max_threads_per_block = p.maxThreadsPerBlock;
  out->shared_per_block = p.sharedMemPerBlock;     /* 48 KiB without opting in */
  out->total_memory = p.totalGlobalMem;
  out->emulated = 0;
  return EM_OK;
}

static em_status real_mem_info(emk_runtime *rt, int dev, size_t *free_bytes, size_t *total) {
  emr *R = emr_of(rt);
  size_t fr = 0, to = 0;
  em_status st = emr_use(R, dev, "mem_info");
  if (st) return st;
  CALLN(R, "mem_info", dev, "cudaMemGetInfo", R->f->cudaMemGetInfo(&fr, &to));
  if (free_bytes) *free_bytes = fr;
  if (total) *total = to;
  return EM_OK;
}

/* -- Memory ------------------------------------------------------------------------------ */

static em_status real_malloc(emk_runtime *rt, int dev, size_t n, void **out) {
  emr *R = emr_of(rt);
  if (!out) return emr_fail(R, EM_ERR_ARG, "malloc: no output (NULL)");
  *out = NULL;
  if (!n) return emr_fail(R, EM_ERR_ARG, "malloc (cuda:%d): 0 bytes", dev);
  em_status st = emr_use(R, dev, "malloc");
  if (st) return st;
  void *p = NULL;
  cudaError_t e = R->f->cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    st = emr_cuda(R, e, "malloc", dev, "cudaMalloc");
    if (st == EM_ERR_NOMEM) {
      size_t fr = 0, to = 0;
      if (R->f->cudaMemGetInfo(&fr, &to) != cudaSuccess) R->f->cudaGetLastError();
      return emr_fail(R, EM_ERR_NOMEM, "malloc (cuda:%d): cudaMalloc of %zu bytes: out of "
                      "device memory (%zu of %zu bytes free)", dev, n, fr, to);
    }
    return st;
  }
  *out = p;
  return EM_OK;
}

/* cudaFree waits for the device's work first, as runtime.h's free must. */
static em_status real_free(emk_runtime *rt, int dev, void *p) {
  emr *R = emr_of(rt);
  if (!p) return EM_OK;
  em_status st = emr_use(R, dev, "free");
  if (st) return st;
  CALLN(R, "free", dev, "cudaFree", R->f->cudaFree(p));
  return EM_OK;
}

static em_status real_host_alloc(emk_runtime *rt, size_t n, void **out) {
  emr *R = emr_of(rt);
  if (!out) return emr_fail(R, EM_ERR_ARG, "host_alloc: no output (NULL)");
  *out = NULL;
  if (!n) return emr_fail(R, EM_ERR_ARG, "host_alloc: 0 bytes");
  /* Portable: pinned for every device, through the home device's context (see
  ** above), not the thread's default cuda:0. */
  em_status st = use_home(R, "host_alloc");
  if (st) return st;
  void *p = NULL;
  cudaError_t e = R->f->cudaHostAlloc(&p, n, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    st = emr_cuda(R, e, "host_alloc", 0, "cudaHostAlloc");
    return st == EM_ERR_NOMEM ? emr_fail(R, EM_ERR_NOMEM, "host_alloc: cudaHostAlloc of %zu "
                                         "bytes: out of page-locked memory", n)
                              : st;
  }
  *out = p;
  return EM_OK;
}

static em_status real_host_free(emk_runtime *rt, void *p) {
  emr *R = emr_of(rt);
  if (!p) return EM_OK;
  em_status st = use_home(R, "host_free");
  if (st) return st;
  CALLN(R, "host_free", 0, "cudaFreeHost", R->f->cudaFreeHost(p));
  return EM_OK;
}

/* -- Streams ------------------------------------------------------------------------------- */

static em_status real_stream_create(emk_runtime *rt, int dev, emk_stream **out) {
  emr *R = emr_of(rt);
  if (!out) return emr_fail(R, EM_ERR_ARG, "stream_create: no output (NULL)");
  *out = NULL;
  em_status st = emr_use(R, dev, "stream_create");
  if (st) return st;
  emk_stream *s = calloc(1, sizeof *s);
  if (!s) return emr_fail(R, EM_ERR_NOMEM, "stream_create: out of host memory");
  cudaError_t e = R->f->cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(s);
    return emr_cuda(R, e, "stream_create", dev, "cudaStreamCreateWithFlags");
  }
  s->magic = EMR_STREAM_MAGIC;
  s->dev = dev;
  emr_kernels_load_on(R, dev);   /* a device opens with its first stream */
  pthread_mutex_lock(&R->mu);
  s->next = R->streams;
  if (R->streams) R->streams->prev = s;
  R->streams = s;
  pthread_mutex_unlock(&R->mu);
  *out = s;
  return EM_OK;
}

/* Drains s, unlinks and frees it; the first error met is returned (the stream is
** gone either way). */
static em_status stream_release(emr *R, emk_stream *s) {
  em_status st = EM_OK;
  cudaError_t e = R->f->cudaSetDevice(s->dev);
  if (e == cudaSuccess) e = R->f->cudaStreamSynchronize(s->s);
  if (e != cudaSuccess) st = emr_cuda(R, e, "stream_destroy", s->dev, "cudaStreamSynchronize");
  emr_gemm_stream_done(R, s);
  e = R->f->cudaStreamDestroy(s->s);
  if (e != cudaSuccess && !st) st = emr_cuda(R, e, "stream_destroy", s->dev, "cudaStreamDestroy");
  pthread_mutex_lock(&R->mu);
  if (s->prev) s->prev->next = s->next;
  else R->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  pthread_mutex_unlock(&R->mu);
  s->magic = 0;
  free(s);
  return st;
}

static em_status real_stream_destroy(emk_runtime *rt, emk_stream *s) {
  emr *R = emr_of(rt);
  if (!s) return EM_OK;
  if (s->magic != EMR_STREAM_MAGIC)
    return emr_fail(R, EM_ERR_ARG, "stream_destroy: %p is not a live stream", (void *)s);
  return stream_release(R, s);
}

/* While s captures: refuses what a graph can't hold, as the emulator does
** (runtime.h), and keeps the first refusal for capture_end. */
static em_status refuse_if_capturing(emr *R, emk_stream *s, const char *what) {
  if (!s->capturing) return EM_OK;
  if (!s->cap_err) {
    s->cap_err = EM_ERR_UNSUPPORTED;
    snprintf(s->cap_msg, sizeof s->cap_msg, "cuda:%d stream is capturing a graph: %s can't "
             "be captured (only kernels, memsets, copies within device memory and from "
             "pinned memory can)", s->dev, what);
  }
  return emr_fail(R, s->cap_err, "%s", s->cap_msg);
}

/* Host memory CUDA knows as pinned (cudaHostAlloc'ed or registered). */
static int host_is_pinned(emr *R, const void *p) {
  struct cudaPointerAttributes a;
  if (!R->f->cudaPointerGetAttributes) return 0;
  if (R->f->cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)R->f->cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeHost;
}

static em_status real_stream_sync(emk_runtime *rt, emk_stream *s) {
  emr *R = emr_of(rt);
  em_status st = emr_check_stream(R, s, "stream_sync");
  if (st || (st = refuse_if_capturing(R, s, "stream_sync (waiting for the stream)"))) return st;
  CALLN(R, "stream_sync", s->dev, "cudaStreamSynchronize", R->f->cudaStreamSynchronize(s->s));
  return EM_OK;
}

/* -- Graphs: stream capture, instantiated once, launched as a whole ----------------
** Relaxed capture mode: the caching allocator may need a new segment (cudaMalloc)
** while a step is captured, which the stricter modes forbid. */
struct emk_graph {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  int dev;
};

static em_status real_capture_begin(emk_runtime *rt, emk_stream *s) {
  emr *R = emr_of(rt);
  em_status st = emr_check_stream(R, s, "capture_begin");
  if (st) return st;
  if (s->capturing)
    return emr_fail(R, EM_ERR_ARG, "capture_begin: cuda:%d stream is already capturing", s->dev);
  CALLN(R, "capture_begin", s->dev, "cudaStreamBeginCapture",
        R->f->cudaStreamBeginCapture(s->s, cudaStreamCaptureModeRelaxed));
  s->capturing = 1;
  s->cap_err = EM_OK;
  s->cap_msg[0] = 0;
  return EM_OK;
}

static em_status real_capture_end(emk_runtime *rt, emk_stream *s, emk_graph **out) {
  emr *R = emr_of(rt);
  *out = NULL;
  em_status st = emr_check_stream(R, s, "capture_end");
  if (st) return st;
  if (!s->capturing)
    return emr_fail(R, EM_ERR_ARG, "capture_end: cuda:%d stream is not capturing", s->dev);
  s->capturing = 0;
  emk_graph *g = calloc(1, sizeof *g);
  cudaGraph_t graph = NULL;
  cudaError_t e = R->f->cudaStreamEndCapture(s->s, &graph);
  if (s->cap_err) {               /* our refusal: the capture ends, its graph is dropped */
    if (graph) R->f->cudaGraphDestroy(graph);
    if (e != cudaSuccess) (void)R->f->cudaGetLastError();
    free(g);
    return emr_fail(R, s->cap_err, "%s", s->cap_msg);
  }
  if (e != cudaSuccess || !g) {
    if (graph) R->f->cudaGraphDestroy(graph);
    free(g);
    if (e == cudaSuccess) return emr_fail(R, EM_ERR_NOMEM, "capture_end: out of host memory");
    return emr_cuda(R, e, "capture_end", s->dev, "cudaStreamEndCapture");
  }
  g->graph = graph;
  g->dev = s->dev;
  if ((e = R->f->cudaGraphInstantiate(&g->exec, graph, 0)) != cudaSuccess) {
    R->f->cudaGraphDestroy(graph);
    free(g);
    return emr_cuda(R, e, "capture_end", s->dev, "cudaGraphInstantiate");
  }
  *out = g;
  return EM_OK;
}

static em_status real_graph_launch(emk_runtime *rt, emk_graph *g, emk_stream *s) {
  emr *R = emr_of(rt);
  em_status st = emr_check_stream(R, s, "graph_launch");
  if (st) return st;
  if (!g) return emr_fail(R, EM_ERR_ARG, "graph_launch: no graph (NULL)");
  CALLN(R, "graph_launch", s->dev, "cudaGraphLaunch", R->f->cudaGraphLaunch(g->exec, s->s));
  return EM_OK;
}

static em_status real_graph_destroy(emk_runtime *rt, emk_graph *g) {
  emr *R = emr_of(rt);
  if (!g) return EM_OK;
  R->f->cudaSetDevice(g->dev);
  R->f->cudaGraphExecDestroy(g->exec);
  R->f->cudaGraphDestroy(g->graph);
  free(g);
  return EM_OK;
}

static const char *copy_name(emk_copy_kind k) {
  return k == EMK_HOST_TO_DEVICE ? "host to device"
       : k == EMK_DEVICE_TO_HOST ? "device to host" : "device to device";
}

static em_status real_memcpy_async(emk_runtime *rt, void *dst, const void *src, size_t n,
                                   emk_copy_kind kind, emk_stream *s) {
  emr *R = emr_of(rt);
  em_status st = emr_check_stream(R, s, "memcpy_async");
  if (st) return st;
  if (!n) return EM_OK;
  if (!dst || !src)
    return emr_fail(R, EM_ERR_ARG, "memcpy_async (%s) of %zu bytes: NULL %s", copy_name(kind),
                    n, dst ? "source" : "destination");
  enum cudaMemcpyKind ck = kind == EMK_HOST_TO_DEVICE ? cudaMemcpyHostToDevice
                         : kind == EMK_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                         : kind == EMK_DEVICE_TO_DEVICE ? cudaMemcpyDeviceToDevice
                         : cudaMemcpyDefault;
  if (kind != EMK_HOST_TO_DEVICE && kind != EMK_DEVICE_TO_HOST && kind != EMK_DEVICE_TO_DEVICE)
    return emr_fail(R, EM_ERR_ARG, "memcpy_async: unknown copy kind %d", (int)kind);
  if (s->capturing && kind == EMK_DEVICE_TO_HOST)
    return refuse_if_capturing(R, s, "a copy to the host");
  if (s->capturing && kind == EMK_HOST_TO_DEVICE && !host_is_pinned(R, src))
    return refuse_if_capturing(R, s, "a copy from pageable host memory");
  cudaError_t e = R->f->cudaMemcpyAsync(dst, src, n, ck, s->s);
  if (e != cudaSuccess) {
    char call[96];
    snprintf(call, sizeof call, "cudaMemcpyAsync (%s, %zu bytes)", copy_name(kind), n);
    return emr_cuda(R, e, "memcpy_async", s->dev, call);
  }
  return EM_OK;
}

static em_status real_memset_async(emk_runtime *rt, void *dst, int byte, size_t n,
                                   emk_stream *s) {
  emr *R = emr_of(rt);
  em_status st = emr_check_stream(R, s, "memset_async");
  if (st) return st;
  if (!n) return EM_OK;
  if (!dst) return emr_fail(R, EM_ERR_ARG, "memset_async of %zu bytes: NULL destination", n);
  CALLN(R, "memset_async", s->dev, "cudaMemsetAsync", R->f->cudaMemsetAsync(dst, byte, n, s->s));
  return EM_OK;
}

/* Lets device dev (current) reach device peer's memory directly, once per pair:
** cudaMemcpyPeerAsync works without it but stages through the host. Where the
** two cannot (no NVLink or P2P over PCIe), the copy still works, staged. */
static void enable_peer(emr *R, int dev, int peer) {
  pthread_mutex_lock(&R->mu);
  if (!(R->peer_tried[dev] & (1u << peer))) {
    R->peer_tried[dev] |= 1u << peer;
    int can = 0;
    if (R->f->cudaDeviceCanAccessPeer(&can, dev, peer) == cudaSuccess && can)
      R->f->cudaDeviceEnablePeerAccess(peer, 0);   /* "already enabled" is fine too */
    (void)R->f->cudaGetLastError();
  }
  pthread_mutex_unlock(&R->mu);
}

static em_status real_memcpy_peer_async(emk_runtime *rt, void *dst, int dst_dev,
                                        const void *src, int src_dev, size_t n,
                                        emk_stream *s) {
  emr *R = emr_of(rt);
  em_status st = emr_check_stream(R, s, "memcpy_peer_async");
  if (st) return st;
  if (dst_dev < 0 || dst_dev >= R->ndev || src_dev < 0 || src_dev >= R->ndev)
    return emr_fail(R, EM_ERR_DEVICE, "memcpy_peer_async: cuda:%d to cuda:%d; this machine "
                    "has %d device%s", src_dev, dst_dev, R->ndev, R->ndev == 1 ? "" : "s");
  if (s->dev != dst_dev && s->dev != src_dev)
    return emr_fail(R, EM_ERR_ARG, "memcpy_peer_async: cuda:%d to cuda:%d on a stream of "
                    "cuda:%d (it must be one of the two)", src_dev, dst_dev, s->dev);
  if (src_dev != dst_dev && (st = refuse_if_capturing(R, s, "a copy between devices")))
    return st;
  if (!n) return EM_OK;
  if (!dst || !src)
    return emr_fail(R, EM_ERR_ARG, "memcpy_peer_async of %zu bytes: NULL %s", n,
                    dst ? "source" : "destination");
  if (dst_dev == src_dev)
    CALLN(R, "memcpy_peer_async", s->dev, "cudaMemcpyAsync (device to device)",
          R->f->cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s->s));
  else {
    enable_peer(R, s->dev, s->dev == dst_dev ? src_dev : dst_dev);
    CALLN(R, "memcpy_peer_async", s->dev, "cudaMemcpyPeerAsync",
          R->f->cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, s->s));
  }
  return EM_OK;
}

static em_status real_host_callback(emk_runtime *rt, emk_stream *s, void (*fn)(void *ud),
                                    void *ud) {
  emr *R = emr_of(rt);
  em_status st = emr_check_stream(R, s, "host_callback");
  if (st) return st;
  if (!fn) return emr_fail(R, EM_ERR_ARG, "host_callback: no function (NULL)");
  if ((st = refuse_if_capturing(R, s, "a host callback"))) return st;
  CALLN(R, "host_callback", s->dev, "cudaLaunchHostFunc", R->f->cudaLaunchHostFunc(s->s, fn, ud));
  return EM_OK;
}

/* -- Events ------------------------------------------------------------------------------- */

static em_status real_event_create(emk_runtime *rt, int dev, emk_event **out) {
  emr *R = emr_of(rt);
  if (!out) return emr_fail(R, EM_ERR_ARG, "event_create: no output (NULL)");
  *out = NULL;
  em_status st = emr_use(R, dev, "event_create");
  if (st) return st;
  emk_event *ev = calloc(1, sizeof *ev);
  if (!ev) return emr_fail(R, EM_ERR_NOMEM, "event_create: out of host memory");
  cudaError_t e = R->f->cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    free(ev);
    return emr_cuda(R, e, "event_create", dev, "cudaEventCreateWithFlags");
  }
  ev->magic = EMR_EVENT_MAGIC;
  ev->dev = dev;
  pthread_mutex_lock(&R->mu);
  ev->next = R->events;
  if (R->events) R->events->prev = ev;
  R->events = ev;
  pthread_mutex_unlock(&R->mu);
  *out = ev;
  return EM_OK;
}

static em_status event_release(emr *R, emk_event *ev) {
  em_status st = EM_OK;
  cudaError_t e = R->f->cudaSetDevice(ev->dev);
  if (e == cudaSuccess) e = R->f->cudaEventDestroy(ev->e);
  if (e != cudaSuccess) st = emr_cuda(R, e, "event_destroy", ev->dev, "cudaEventDestroy");
  pthread_mutex_lock(&R->mu);
  if (ev->prev) ev->prev->next = ev->next;
  else R->events = ev->next;
  if (ev->next) ev->next->prev = ev->prev;
  pthread_mutex_unlock(&R->mu);
  ev->magic = 0;
  free(ev);
  return st;
}

static em_status real_event_destroy(emk_runtime *rt, emk_event *ev) {
  emr *R = emr_of(rt);
  if (!ev) return EM_OK;
  if (ev->magic != EMR_EVENT_MAGIC)
    return emr_fail(R, EM_ERR_ARG, "event_destroy: %p is not a live event", (void *)ev);
  return event_release(R, ev);
}

static em_status real_event_record(emk_runtime *rt, emk_event *ev, emk_stream *s) {
  emr *R = emr_of(rt);
  em_status st = check_event(R, ev, "event_record");
  if (st || (st = emr_check_stream(R, s, "event_record"))) return st;
  if (ev->dev != s->dev)
    return emr_fail(R, EM_ERR_ARG, "event_record: an event of cuda:%d on a stream of cuda:%d "
                    "(CUDA records an event only on its own device's streams)", ev->dev, s->dev);
  if ((st = refuse_if_capturing(R, s, "an event record"))) return st;
  CALLN(R, "event_record", s->dev, "cudaEventRecord", R->f->cudaEventRecord(ev->e, s->s));
  return EM_OK;
}

/* The stream may belong to another device than the event: CUDA allows that wait. */
static em_status real_stream_wait_event(emk_runtime *rt, emk_stream *s, emk_event *ev) {
  emr *R = emr_of(rt);
  em_status st = check_event(R, ev, "stream_wait_event");
  if (st || (st = emr_check_stream(R, s, "stream_wait_event"))) return st;
  if ((st = refuse_if_capturing(R, s, "a wait for another stream's event"))) return st;
  CALLN(R, "stream_wait_event", s->dev, "cudaStreamWaitEvent",
        R->f->cudaStreamWaitEvent(s->s, ev->e, 0));
  return EM_OK;
}

/* cudaEventQuery of an event never recorded is cudaSuccess: done, as runtime.h says. */
static em_status real_event_query(emk_runtime *rt, emk_event *ev, int *done) {
  emr *R = emr_of(rt);
  if (!done) return emr_fail(R, EM_ERR_ARG, "event_query: no output (NULL)");
  *done = 0;
  em_status st = check_event(R, ev, "event_query");
  if (st) return st;
  cudaError_t e = R->f->cudaEventQuery(ev->e);
  if (e == cudaSuccess) *done = 1;
  else if (e == cudaErrorNotReady) R->f->cudaGetLastError();   /* not an error */
  else return emr_cuda(R, e, "event_query", ev->dev, "cudaEventQuery");
  return EM_OK;
}

static em_status real_event_sync(emk_runtime *rt, emk_event *ev) {
  emr *R = emr_of(rt);
  em_status st = check_event(R, ev, "event_sync");
  if (st) return st;
  CALLN(R, "event_sync", ev->dev, "cudaEventSynchronize", R->f->cudaEventSynchronize(ev->e));
  return EM_OK;
}

/* -- Opening and closing -------------------------------------------------------------------- */

static void real_close(emk_runtime *rt) {
  emr *R = emr_of(rt);
  if (!R) return;
  while (R->streams) stream_release(R, R->streams);
  while (R->events) event_release(R, R->events);
  emr_gemm_close(R);
  emr_dnn_close(R);
  emr_kernels_close(R);
  emk_libs_close(R->L);
  pthread_mutex_destroy(&R->mu);
  pthread_mutex_destroy(&R->err_mu);
  free(R);
}

em_status emk_real_open(emk_runtime **out, char *err, size_t errlen) {
  if (!out) {
    snprintf(err, errlen, "CUDA runtime: no output (NULL)");
    return EM_ERR_ARG;
  }
  *out = NULL;
  emk_libs *L = NULL;
  char why[EMK_ERRMSG_SIZE];
  const emk_cudart_fns *f = NULL;
  int n = 0;
  em_status st = emk_libs_open(&L, why, sizeof why);
  if (!st) st = emk_libs_cudart(L, &f, why, sizeof why);
  if (!st) st = emk_libs_device_count(L, &n, why, sizeof why);   /* "no CUDA driver (...)" */
  if (!st && n == 0) {
    snprintf(why, sizeof why, "no CUDA device (the driver sees none; CUDA_VISIBLE_DEVICES=%s)",
             getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    st = EM_ERR_DEVICE;
  }
  if (st) {
    emk_libs_close(L);
    snprintf(err, errlen, "%s", why);
    /* A library missing is as much "no usable GPU" as a driver missing. */
    return st == EM_ERR_NOMEM ? st : EM_ERR_DEVICE;
  }
  emr *R = calloc(1, sizeof *R);
  if (!R) {
    emk_libs_close(L);
    snprintf(err, errlen, "CUDA runtime: out of host memory");
    return EM_ERR_NOMEM;
  }
  R->rt.ops = &real_ops;
  R->rt.impl = R;
  R->L = L;
  R->f = f;
  R->ndev = n < EMK_MAX_DEVICES ? n : EMK_MAX_DEVICES;
  R->home = -1;
  pthread_mutex_init(&R->mu, NULL);
  pthread_mutex_init(&R->err_mu, NULL);
  *out = &R->rt;
  return EM_OK;
}

unsigned emk_real_contexts(emk_runtime *rt) {
  emr *R = emr_of(rt);
  return R ? __atomic_load_n(&R->contexts, __ATOMIC_RELAXED) : 0;
}

static const emk_runtime_ops real_ops = {
  .name = "cuda",
  .close = real_close,
  .device_count = real_device_count,
  .device_props = real_device_props,
  .mem_info = real_mem_info,
  .malloc = real_malloc,
  .free = real_free,
  .host_alloc = real_host_alloc,
  .host_free = real_host_free,
  .stream_create = real_stream_create,
  .stream_destroy = real_stream_destroy,
  .stream_sync = real_stream_sync,
  .memcpy_async = real_memcpy_async,
  .memset_async = real_memset_async,
  .memcpy_peer_async = real_memcpy_peer_async,
  .capture_begin = real_capture_begin,
  .capture_end = real_capture_end,
  .graph_launch = real_graph_launch,
  .graph_destroy = real_graph_destroy,
  .host_callback = real_host_callback,
  .event_create = real_event_create,
  .event_destroy = real_event_destroy,
  .event_record = real_event_record,
  .stream_wait_event = real_stream_wait_event,
  .event_query = real_event_query,
  .event_sync = real_event_sync,
  .launch = emr_launch,
  .gemm = emr_gemm,
  .conv_algos = emr_conv_algos,          /* dnn_real.c */
  .conv = emr_conv,
  .batch_norm_fwd = emr_batch_norm_fwd,
  .batch_norm_bwd = emr_batch_norm_bwd,
};
#endif /* EMK_HAVE_CUDART_H */
