/*
** test_cuda_emu_strict.c -- the emulated runtime refuses what real multi-GPU
** CUDA refuses, so that code which would fail on hardware fails in CI too:
** a kernel, a GEMM or a cuDNN call queued on a stream of one device
** whose arguments point into another device's memory (an illegal address on
** CUDA without peer access) fails at the call, naming both devices; the same
** data moved by memcpy_peer_async, the path ember's cross-device copies take
** (kernels/backend.c), works.
**
** What needs no check here: a device-to-device memcpy_async across devices is
** a copy real CUDA makes too (unified addressing; test_cuda_emu.c's
** test_copies), and the runtime table has no current device to forget -- every
** entry names its device or its stream's, and the real runtime sets CUDA's
** per-thread current device on each call (kernels/real/runtime_real.c).
*/
#include "check.h"
#include "../../kernels/runtime.h"
#include <stdint.h>
#include <string.h>

static int rt_ok(emk_runtime *rt, em_status st, const char *file, int line, const char *expr) {
  return chk_report(st == EM_OK, file, line, expr, "status %d: %s", (int)st,
                    st ? rt->errmsg : "");
}
#define RT_OK(rt, call) rt_ok((rt), (call), __FILE__, __LINE__, #call)
#define RT_REQUIRE(rt, call) do { if (!RT_OK(rt, call)) return; } while (0)
/* The call fails with `code` and rt->errmsg holds every following string. */
#define RT_ERR(rt, call, code, ...) do { \
    em_status e_st_ = (call); \
    chk_report(e_st_ == (code) && chk_msg_has((rt)->errmsg, __VA_ARGS__, (const char *)NULL), \
               __FILE__, __LINE__, #call, "status %d (want %d), message \"%s\"", \
               (int)e_st_, (int)(code), (rt)->errmsg); \
  } while (0)

static emk_runtime *open_rt(int devices) {
  emk_emu_config cfg = {devices, (size_t)1 << 20};
  emk_runtime *rt = NULL;
  char err[256];
  em_status st = emk_emu_open(&cfg, &rt, err, sizeof err);
  chk_report(st == EM_OK, __FILE__, __LINE__, "emk_emu_open", "%s", err);
  return st ? NULL : rt;
}

/* A kernel's argument struct as the kernels' k_*_args.h headers write them:
** pointers among sizes and scalars. */
typedef struct scale_args { int64_t n; float *x; double alpha; const float *y; } scale_args;
static int scale_runs;                 /* bodies run (on the stream's thread) */
static void scale_body(const void *args) {
  (void)args;
  __atomic_add_fetch(&scale_runs, 1, __ATOMIC_RELAXED);
}
static const emk_kernel scale_kernel = {"emu_strict_scale", scale_body, NULL, 0};

static void test_kernel_reads_other_device(void) {
  emk_runtime *rt = open_rt(2);
  REQUIRE(rt);
  emk_stream *s0, *s1;
  float *a0, *b0, *a1;
  RT_REQUIRE(rt, rt->ops->stream_create(rt, 0, &s0));
  RT_REQUIRE(rt, rt->ops->stream_create(rt, 1, &s1));
  RT_REQUIRE(rt, rt->ops->malloc(rt, 0, 256, (void **)&a0));
  RT_REQUIRE(rt, rt->ops->malloc(rt, 0, 256, (void **)&b0));
  RT_REQUIRE(rt, rt->ops->malloc(rt, 1, 256, (void **)&a1));
  emk_dim3 one = {1, 1, 1};

  /* on its own device's memory: runs */
  scale_args ok = {64, a0, 2.0, b0};
  RT_OK(rt, rt->ops->launch(rt, &scale_kernel, one, one, 0, s0, &ok, sizeof ok));
  RT_OK(rt, rt->ops->stream_sync(rt, s0));
  CHECK(scale_runs == 1, "the kernel ran %d times", scale_runs);

  /* an input on the other device, at its start or inside it: refused at the
  ** call, naming the kernel, both devices and where in the arguments */
  scale_args in = {64, a0, 2.0, a1};
  RT_ERR(rt, rt->ops->launch(rt, &scale_kernel, one, one, 0, s0, &in, sizeof in),
         EM_ERR_DEVICE, "launch emu_strict_scale", "stream of cuda:0",
         "byte 24", "memory of cuda:1", "peer access");
  scale_args mid = {64, a1 + 3, 2.0, a1};
  RT_ERR(rt, rt->ops->launch(rt, &scale_kernel, one, one, 0, s0, &mid, sizeof mid),
         EM_ERR_DEVICE, "byte 8", "memory of cuda:1");
  /* and the other way round */
  RT_ERR(rt, rt->ops->launch(rt, &scale_kernel, one, one, 0, s1, &ok, sizeof ok),
         EM_ERR_DEVICE, "stream of cuda:1", "memory of cuda:0");
  /* a refused launch queued nothing, and the stream stays usable */
  RT_OK(rt, rt->ops->stream_sync(rt, s0));
  RT_OK(rt, rt->ops->stream_sync(rt, s1));
  CHECK(scale_runs == 1, "a refused launch ran (%d runs)", scale_runs);

  /* the copy path moves the data across, then the kernel runs on it */
  RT_OK(rt, rt->ops->memcpy_peer_async(rt, b0, 0, a1, 1, 256, s0));
  RT_OK(rt, rt->ops->launch(rt, &scale_kernel, one, one, 0, s0, &ok, sizeof ok));
  RT_OK(rt, rt->ops->stream_sync(rt, s0));
  CHECK(scale_runs == 2, "the kernel ran %d times", scale_runs);

  /* a freed block of the other device no longer owns its addresses (the
  ** launch is then a range error for the kernel's own checks to find, not a
  ** device mix-up) */
  RT_OK(rt, rt->ops->free(rt, 1, a1));
  RT_OK(rt, rt->ops->launch(rt, &scale_kernel, one, one, 0, s0, &in, sizeof in));
  RT_OK(rt, rt->ops->stream_sync(rt, s0));

  RT_OK(rt, rt->ops->stream_destroy(rt, s0));
  RT_OK(rt, rt->ops->stream_destroy(rt, s1));
  RT_OK(rt, rt->ops->free(rt, 0, a0));
  RT_OK(rt, rt->ops->free(rt, 0, b0));
  rt->ops->close(rt);
}

/* The library calls (GEMM, cuDNN) read their operands on the stream's device
** too. */
static void test_library_reads_other_device(void) {
  emk_runtime *rt = open_rt(2);
  REQUIRE(rt);
  emk_stream *s0;
  float *a0, *b0, *c0, *c1;
  RT_REQUIRE(rt, rt->ops->stream_create(rt, 0, &s0));
  RT_REQUIRE(rt, rt->ops->malloc(rt, 0, 64, (void **)&a0));
  RT_REQUIRE(rt, rt->ops->malloc(rt, 0, 64, (void **)&b0));
  RT_REQUIRE(rt, rt->ops->malloc(rt, 0, 64, (void **)&c0));
  RT_REQUIRE(rt, rt->ops->malloc(rt, 1, 64, (void **)&c1));
  RT_OK(rt, rt->ops->memset_async(rt, a0, 0, 64, s0));
  RT_OK(rt, rt->ops->memset_async(rt, b0, 0, 64, s0));
  RT_OK(rt, rt->ops->gemm(rt, s0, EM_FLOAT32, 4, 4, 4, 1, a0, 4, 1, 0, b0, 4, 1, 0,
                          c0, 4, 1, 0, 0));
  RT_ERR(rt, rt->ops->gemm(rt, s0, EM_FLOAT32, 4, 4, 4, 1, a0, 4, 1, 0, b0, 4, 1, 0,
                           c1, 4, 1, 0, 0),
         EM_ERR_DEVICE, "gemm on a stream of cuda:0", "memory of cuda:1");
  RT_OK(rt, rt->ops->stream_sync(rt, s0));
  RT_OK(rt, rt->ops->stream_destroy(rt, s0));
  RT_OK(rt, rt->ops->free(rt, 0, a0));
  RT_OK(rt, rt->ops->free(rt, 0, b0));
  RT_OK(rt, rt->ops->free(rt, 0, c0));
  RT_OK(rt, rt->ops->free(rt, 1, c1));
  rt->ops->close(rt);
}

int main(void) {
  RUN(test_kernel_reads_other_device);
  RUN(test_library_reads_other_device);
  return check_done();
}
