/*
** runtime.h -- the device runtime table: every call the CUDA backend (kernels/)
** makes to a device goes through one of these functions, and nothing else in
** kernels/ talks to CUDA. Two implementations fill the table:
**   - real (kernels/real/): the CUDA runtime, cuBLASLt, cuDNN and NCCL, loaded
**     only when used, for machines with a GPU;
**   - emulated (kernels/emu/): chosen by EMBER_CUDA_EMULATE=N[:MB]. Device memory
**     is host memory that the host side of ember never touches directly (guard
**     bytes around every block, a capacity per device, injectable failures), each
**     stream is a worker thread running its queue in order, events are sequence
**     numbers on a stream, and kernels run on the grid emulator (grid.h): the same
**     kernel sources compiled for the host.
** So the backend's own code -- its allocator, its stream discipline, its kernels
** -- runs and is tested on a machine without a GPU (DESIGN.md, principle 8).
**
** Conventions. A runtime is an object (no globals): emk_real_open or
** emk_emu_open makes one, the state's CUDA context owns it (emk_cuda, cuda.h).
** Every entry returns EM_OK or an error code with a message in rt->errmsg.
** Errors of asynchronous work (a kernel that failed on a stream, a copy out of
** bounds) are kept by the stream and returned by its next synchronising call
** (stream_sync, event_sync, or any call on that stream), as CUDA does with
** sticky errors -- but a failed stream stays usable after it was reported.
** Pointers are device pointers unless named host.
**
** Contexts. A real device's CUDA context (hundreds of MB of its memory, and in
** EXCLUSIVE_PROCESS mode one process at a time) is made by the first call that
** needs one on it: memory, streams, events, mem_info, conv_algos. device_count
** and device_props make none, so the backend can count and describe every
** device while it opens only those a state uses (cuda.c). Pinned host memory
** (host_alloc, host_free) goes through the first device that got a context
** (cuda:0's, as CUDA's default, when none has one yet). The emulated runtime
** records the devices it would have made a context on (emk_emu_contexts), the
** real one the devices it did (emk_real_contexts).
*/
#ifndef EMBER_KERNELS_RUNTIME_H
#define EMBER_KERNELS_RUNTIME_H
#include "ember.h"
#include <stddef.h>
#include <stdint.h>

enum { EMK_ERRMSG_SIZE = 512, EMK_MAX_DEVICES = 16 };

typedef struct emk_stream emk_stream;   /* in order; owned by the runtime */
typedef struct emk_graph emk_graph;     /* captured work (capture_end) */
typedef struct emk_event emk_event;

typedef struct emk_dim3 { unsigned x, y, z; } emk_dim3;

typedef struct emk_device_props {
  char name[128];
  int major, minor;               /* compute capability */
  int multiprocessors;
  int warp_size;                  /* 32 */
  int max_threads_per_block;      /* 1024 */
  size_t shared_per_block;        /* bytes of shared memory a block may use */
  size_t total_memory;            /* bytes */
  int emulated;                   /* 1 for the emulated runtime */
} emk_device_props;

typedef enum emk_copy_kind {
  EMK_HOST_TO_DEVICE, EMK_DEVICE_TO_HOST, EMK_DEVICE_TO_DEVICE
} emk_copy_kind;

/* A kernel, as device.h's EMK_KERNEL defines it: one source, two bodies. The
** descriptor lives in the host build of the source (a .cu compiled as C++, or a C
** file such as a test's); the real runtime finds the device body by the name. */
typedef struct emk_kernel {
  const char *name;
  /* The host-compiled body, run once per CUDA thread by the grid emulator with
  ** that thread's indices current; args points at the kernel's argument struct. */
  void (*host_body)(const void *args);
  /* The __global__ function nvcc compiled (NULL in a host-only build); it takes
  ** the argument struct by value. */
  const void *device_fn;
  int uses_barriers;       /* calls __syncthreads or warp shuffles: needs fibers */
} emk_kernel;

/* Declares the descriptor of a kernel that a kernels/k_*.cu defines, for the C
** launchers that queue it: C linkage, and hidden, so libember_cuda does not export
** it. */
#ifdef __cplusplus
#define EMK_KERNEL_DECL(name) \
  extern "C" __attribute__((visibility("hidden"))) const emk_kernel name
#else
#define EMK_KERNEL_DECL(name) extern __attribute__((visibility("hidden"))) const emk_kernel name
#endif

/* The nn entries' arguments (below). A convolution (cross-correlation, groups G)
** of x (N, C, H, W) with w (O, C/G, kH, kW) giving y (N, O, OH, OW), run in one
** direction: FWD writes y = conv(x, w) + bias (bias (O) or NULL); BWD_DATA writes
** x = the gradient for x from y (the output's gradient) and w; BWD_FILTER writes
** w = the gradient for w from x and y (the output's gradient), and bias (or NULL)
** = the gradient for the bias. */
typedef enum emk_conv_dir { EMK_CONV_FWD, EMK_CONV_BWD_DATA, EMK_CONV_BWD_FILTER } emk_conv_dir;
typedef struct emk_conv_desc {
  int dir;                        /* emk_conv_dir */
  em_dtype dtype;
  int allow_tf32;                 /* float32 may use TF32 tensor cores (the emulator ignores it) */
  int64_t N, C, H, W, O, kH, kW, OH, OW, sH, sW, pH, pW, dH, dW, G;
  int nhwc;                       /* x, w, y channels last, densely: (N, H, W, C),
                                  ** (O, kH, kW, C/G), (N, OH, OW, O); else NCHW */
} emk_conv_desc;
/* An algorithm for a convolution, as conv_algos lists it and conv runs it: its
** number, the workspace bytes it needs, and the math mode it runs in (cuDNN's
** cudnnMathType_t; the emulator fills it by the same rule, emk_conv_math in dnn.h). */
enum { EMK_MATH_DEFAULT = 0, EMK_MATH_TENSOR_OP = 1, EMK_MATH_TENSOR_OP_CONVERT = 2,
       EMK_MATH_FMA = 3 };
typedef struct emk_conv_algo { int algo; size_t workspace; int math; } emk_conv_algo;
/* Batch norm over x seen as (N, C, L), N*L >= 2; nhwc: x is stored channels last,
** as N*L rows of C. */
typedef struct emk_bn_desc {
  em_dtype dtype;
  int64_t N, C, L;
  double momentum, eps;
  int nhwc;
} emk_bn_desc;

typedef struct emk_runtime emk_runtime;

typedef struct emk_runtime_ops {
  const char *name;                               /* "cuda" or "emulated" */
  void (*close)(emk_runtime *rt);                 /* after every stream drained */
  int (*device_count)(emk_runtime *rt);
  em_status (*device_props)(emk_runtime *rt, int dev, emk_device_props *out);
  em_status (*mem_info)(emk_runtime *rt, int dev, size_t *free_bytes, size_t *total);

  /* Device memory: raw blocks for the caching allocator (kernels/alloc.c), which
  ** is the only caller. n > 0; a refusal is EM_ERR_NOMEM. */
  em_status (*malloc)(emk_runtime *rt, int dev, size_t n, void **out);
  em_status (*free)(emk_runtime *rt, int dev, void *p);
  /* Page-locked host memory for asynchronous copies (see Contexts above). */
  em_status (*host_alloc)(emk_runtime *rt, size_t n, void **out);
  em_status (*host_free)(emk_runtime *rt, void *p);

  /* Streams: work on one stream runs in the order it was queued. */
  em_status (*stream_create)(emk_runtime *rt, int dev, emk_stream **out);
  em_status (*stream_destroy)(emk_runtime *rt, emk_stream *s);   /* drains first */
  em_status (*stream_sync)(emk_runtime *rt, emk_stream *s);
  /* Asynchronous: host memory must stay valid until the copy ran (pinned, or
  ** waited for); the call returns once the copy is queued. */
  em_status (*memcpy_async)(emk_runtime *rt, void *dst, const void *src, size_t n,
                            emk_copy_kind kind, emk_stream *s);
  em_status (*memset_async)(emk_runtime *rt, void *dst, int byte, size_t n,
                            emk_stream *s);
  /* Queues a copy of n bytes from device src_dev's memory to device dst_dev's
  ** on s, a stream of either device (the caller orders it after the other
  ** device's work with an event). dst_dev == src_dev is a plain D2D copy. */
  em_status (*memcpy_peer_async)(emk_runtime *rt, void *dst, int dst_dev, const void *src,
                                 int src_dev, size_t n, emk_stream *s);
  /* Runs fn(ud) on the stream's timeline, after the work queued before it (on the
  ** emulator, on the stream's thread; on CUDA, as a host function): used to free
  ** what the queued work still reads. fn must not call the runtime. */
  em_status (*host_callback)(emk_runtime *rt, emk_stream *s, void (*fn)(void *ud),
                             void *ud);

  /* Events mark a point in a stream's work. */
  em_status (*event_create)(emk_runtime *rt, int dev, emk_event **out);
  em_status (*event_destroy)(emk_runtime *rt, emk_event *e);
  em_status (*event_record)(emk_runtime *rt, emk_event *e, emk_stream *s);
  /* Work queued on s after this waits until e's point was reached. */
  em_status (*stream_wait_event)(emk_runtime *rt, emk_stream *s, emk_event *e);
  /* *done = 1 once every piece of work before the recorded point has run (an
  ** event never recorded counts as done). */
  em_status (*event_query)(emk_runtime *rt, emk_event *e, int *done);
  em_status (*event_sync)(emk_runtime *rt, emk_event *e);

  /* Graphs. Between capture_begin and capture_end, work queued on s is recorded,
  ** not run; graph_launch queues the recorded work on a stream again, as it was
  ** recorded: the same pointers, the same kernel arguments. What can be captured:
  ** kernels, memsets, copies within device memory and from pinned host memory,
  ** GEMMs. Anything else queued
  ** on s while capturing (a copy to or from the host, a host callback, an event,
  ** a wait), and a sync of s, fails and spoils the capture: capture_end then
  ** returns that error (and no graph). The caller keeps every buffer the work
  ** uses alive while the graph lives. */
  em_status (*capture_begin)(emk_runtime *rt, emk_stream *s);
  em_status (*capture_end)(emk_runtime *rt, emk_stream *s, emk_graph **out);
  em_status (*graph_launch)(emk_runtime *rt, emk_graph *g, emk_stream *s);
  em_status (*graph_destroy)(emk_runtime *rt, emk_graph *g);

  /* Queues kernel k on s over grid x block threads with dyn_shared bytes of
  ** dynamic shared memory; args (args_size bytes) is copied at the call. */
  em_status (*launch)(emk_runtime *rt, const emk_kernel *k, emk_dim3 grid,
                      emk_dim3 block, size_t dyn_shared, emk_stream *s,
                      const void *args, size_t args_size);

  /* Queues a strided batched GEMM on s: for every i < batch,
  **   C[i] (m x n) = A[i] (m x k) x B[i] (k x n)
  ** where element (r, c) of A[i] is at a + (i*a_bs + r*a_rs + c*a_cs) elements
  ** (likewise B and C): any non-negative element strides, so transposed and
  ** strided views need no copy; a batch stride of 0 reuses one matrix for every
  ** i (broadcast). A, B and C have the one dtype `dtype`: float32, float64,
  ** float16 or bfloat16 (the last two accumulate in float32 and round once).
  ** k = 0 writes zeros; m, n or batch = 0 does nothing. C must not overlap A or
  ** B. allow_tf32: float32 may use TF32 tensor cores (the emulator ignores it).
  ** Argument errors are returned at once; range errors on the device are the
  ** stream's sticky error. The real runtime runs it through cuBLASLt
  ** (kernels/real/gemm_real.c: a matmul descriptor per call; an operand with no
  ** unit stride is EM_ERR_UNSUPPORTED there, which k_matmul.c avoids by copying
  ** it first); the emulated one computes it with OpenBLAS on the stream's
  ** thread (kernels/emu/gemm_emu.c). */
  em_status (*gemm)(emk_runtime *rt, emk_stream *s, em_dtype dtype, int64_t m, int64_t n,
                    int64_t k, int64_t batch,
                    const void *a, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                    const void *b, int64_t b_rs, int64_t b_cs, int64_t b_bs,
                    void *c, int64_t c_rs, int64_t c_cs, int64_t c_bs, int allow_tf32);

  /* -- nn (types above; real: cuDNN 9 in real/dnn_real.c; emulated:
  ** the CPU backend's kernels on the stream's thread in emu/dnn_emu.c). Arrays are
  ** dense NCHW (a convolution's: NHWC when c->nhwc) device memory of c->dtype
  ** (float32, float64; a convolution's also float16 or bfloat16) on s's device.
  ** conv_algos lists, best first, up to max algorithms for convolution c with the
  ** workspace bytes and math mode each needs (*n of them); conv queues algorithm
  ** algo (one of that list, math mode included) with a workspace ws of ws_size bytes (see emk_conv_desc for what x, w, y, bias hold
  ** in each direction). batch_norm_fwd (training) and batch_norm_bwd: x, y, gy, gx
  ** (N, C, L), dense NCHW or (b->nhwc) channels last, all alike; w, b, mean, invstd, gw, gb (C), none NULL; running_mean and
  ** running_var (C) both given or both NULL. mean/invstd receive the batch mean
  ** and 1/sqrt(biased var + eps); the running ones move by momentum towards the
  ** mean and the unbiased variance. */
  em_status (*conv_algos)(emk_runtime *rt, int dev, const emk_conv_desc *c,
                          emk_conv_algo *out, int max, int *n);
  em_status (*conv)(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c,
                    const emk_conv_algo *algo, void *ws, size_t ws_size, void *x, void *w,
                    void *y, void *bias);
  em_status (*batch_norm_fwd)(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                              const void *x, const void *w, const void *bias, void *y,
                              void *mean, void *invstd, void *running_mean,
                              void *running_var);
  em_status (*batch_norm_bwd)(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                              const void *x, const void *gy, const void *w, const void *mean,
                              const void *invstd, void *gx, void *gw, void *gb);
} emk_runtime_ops;

struct emk_runtime {
  const emk_runtime_ops *ops;
  void *impl;
  char errmsg[EMK_ERRMSG_SIZE];
};

/* Sets rt->errmsg and returns code (so: return emk_fail(rt, ...)). */
em_status emk_fail(emk_runtime *rt, em_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same for an err buffer (err may be NULL, errlen 0): writes the message,
** returns code. */
em_status emk_errf(char *err, size_t errlen, em_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* -- The real runtime (kernels/real/) -------------------------------------------------
** The CUDA runtime and cuBLASLt of the toolkit, loaded with dlopen (real/libs.h).
** Fails with EM_ERR_DEVICE and why (no driver, no device, a library missing)
** on machines without a usable GPU. */
em_status emk_real_open(emk_runtime **out, char *err, size_t errlen);

/* -- The emulated runtime (kernels/emu/) ------------------------------------------ */
typedef struct emk_emu_config {
  int devices;               /* 1 .. EMK_MAX_DEVICES */
  size_t capacity;           /* bytes per device (0 = 1024 MiB) */
} emk_emu_config;
/* Parses EMBER_CUDA_EMULATE's text: "N" or "N:MB". 0 and a message on bad text. */
em_status emk_emu_parse(const char *text, emk_emu_config *out, char *err, size_t errlen);
em_status emk_emu_open(const emk_emu_config *cfg, emk_runtime **out, char *err,
                       size_t errlen);
/* Test hooks: the k-th device allocation from now fails (0 = none); bytes in
** use on a device; whether any guard byte was overwritten (then a message). */
void emk_emu_fail_nth_malloc(emk_runtime *rt, int k);
size_t emk_emu_bytes_in_use(emk_runtime *rt, int dev);
int emk_emu_check_guards(emk_runtime *rt, char *msg, size_t msglen);
/* More test hooks. For bytes_in_use and live_blocks, dev -1 means pinned host
** memory. live_blocks: blocks not freed yet (what close would free: leaks).
** pageable_copies: host<->device copies queued so far whose host side was not
** inside pinned memory. write_raw: writes n bytes at device address dst with no
** range check, only that they lie in one live block or its guard bytes (to
** test that guards catch what the range checks cannot see, as a kernel writing
** out of bounds). check_guards returns the number of damaged blocks and lists
** them in msg. */
size_t emk_emu_live_blocks(emk_runtime *rt, int dev);
/* Bit d set once a call that makes a CUDA context on device d on real CUDA ran
** on this runtime (see Contexts above); for tests that a state touches only the
** devices it uses. emk_real_contexts: the real runtime's own record. */
unsigned emk_emu_contexts(emk_runtime *rt);
unsigned emk_real_contexts(emk_runtime *rt);
/* Bit d: device d refuses a new context from now (one it has stays), as a GPU in
** EXCLUSIVE_PROCESS mode that another process holds; 0 makes all available. */
void emk_emu_set_unavailable(emk_runtime *rt, unsigned mask);
size_t emk_emu_pageable_copies(emk_runtime *rt);
em_status emk_emu_write_raw(emk_runtime *rt, void *dst, const void *src, size_t n);
/* The emulator's host side may read and write device memory only through
** these (tests, and the CPU stand-ins for the libraries, which run on the
** stream's thread): they check that [p, p+n) lies inside one live block. */
em_status emk_emu_check_range(emk_runtime *rt, const void *p, size_t n);

#endif
