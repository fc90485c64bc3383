/*
** dnnl.c -- oneDNN (Intel's deep learning kernels, Debian's libdnnl2) behind the
** CPU conv and matmul entries, where it measured faster than ember's own kernels.
**
** Design. The library is opened with dlopen the first time an op asks (never a
** link-time dependency: ember stays embeddable and its packed archives small), and
** only when the build saw oneDNN's header (the C API's structs and enums come from
** it; the loaded library must have the same major version). Without it every call
** declines and ember's kernels run, and `ember --info` says why.
**
** Primitives. Creating a oneDNN primitive costs milliseconds (it picks and JITs a
** kernel), so each one is made once per (op, direction, dtype, geometry, strides of
** every tensor, activation policy) and kept in a process-wide cache for the life of
** the process. Tensors are described with their actual strides, so NCHW- and
** NHWC-contiguous tensors both go in without copies; other strides are declined.
** Weights are described as "any": the primitive picks its blocked format and a
** cached reorder converts ember's weights (small) on every call. In the "blocked"
** activation policy the activations get the same treatment (reorders in and out),
** which the measurements below decide per case.
**
** Threads. oneDNN here runs on OpenMP (libgomp). Each call runs on the calling
** thread with OpenMP's thread count set to the state's (em.set_num_threads), while
** ember's workers sleep (no parallel_for is open) and OpenBLAS is not called, so
** the two cores are never oversubscribed. Idle OpenMP threads spin only briefly
** before they sleep (GOMP_SPINCOUNT, unless the user set it or OMP_WAIT_POLICY),
** since ember's workers take the cores right after. Scratch memory is ember's, per call,
** and each thread has its own stream, so replica threads may share primitives.
**
** ISA. oneDNN picks AMX/AVX-512/AVX2 kernels at run time (ONEDNN_MAX_CPU_ISA caps
** it); bfloat16 accumulates in float32.
**
** Which cases oneDNN serves ("auto") follows measurements on the dev machine: the
** policy table below, with its numbers (also in README.md's "CPU kernels").
*/
#include "dnnl.h"
#include "nn.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Under the sanitizers oneDNN stays off: libgomp is not instrumented (ThreadSanitizer
** reports its barriers) and LeakSanitizer's exit-time scan crashes on its threads. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define EMI_DNNL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define EMI_DNNL_SANITIZED 1
#endif
#endif

#if defined(__has_include)
#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#define EMI_HAVE_DNNL 1
#endif
#endif

/* -- Mode (process-wide) ----------------------------------------------------------- */

enum { MODE_AUTO = 0, MODE_OURS = 1, MODE_ONEDNN = 2, MODE_BLOCKED = 3 };
static const char *const mode_names[] = {"auto", "ours", "onednn", "onednn-blocked"};
static int g_mode = -1;   /* -1: not read from EMBER_CPU_KERNELS yet */

static int mode_parse(const char *s) {
  for (int i = 0; i < 4; i++)
    if (s && strcmp(s, mode_names[i]) == 0) return i;
  return -1;
}

static int mode_now(void) {
  int m = __atomic_load_n(&g_mode, __ATOMIC_ACQUIRE);
  if (m < 0) {
    m = mode_parse(getenv("EMBER_CPU_KERNELS"));
    if (m < 0) m = MODE_AUTO;
    int expect = -1;
    __atomic_compare_exchange_n(&g_mode, &expect, m, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    m = __atomic_load_n(&g_mode, __ATOMIC_ACQUIRE);
  }
  return m;
}

em_status em_cpu_kernels_set(const char *mode) {
  int m = mode_parse(mode);
  if (m < 0) return EM_ERR_ARG;
  __atomic_store_n(&g_mode, m, __ATOMIC_RELEASE);
  return EM_OK;
}

const char *em_cpu_kernels_get(void) { return mode_names[mode_now()]; }

/* -- Policy: which cases oneDNN serves in "auto" ---------------------------------------
** Indexed [op][dtype][layout]: op conv forward / backward data / backward weights /
** matmul; dtype float32, bfloat16; layout NCHW, NHWC (matmul: one column). The
** values: OURS, PLAIN (oneDNN on the tensors as they are), BLOCKED (activations
** reordered into oneDNN's blocked format and back).
**
** Measured with tests/bench/bench_cpu_kernels.lua (2 threads, a 2-core Xeon with
** AVX-512 BF16 and no AMX, shared with other work; oneDNN 2.6.3 from Debian),
** as ratios ours/oneDNN of whole-net time (ResNet-18 32x32 batch 64, then the
** Fashion-MNIST CNN batch 128), > 1 where oneDNN is faster:
**   float32 NCHW   fwd 0.76 / 0.75, bwd data 0.53 / 0.70, bwd weights 0.20 / 0.61
**                  (oneDNN runs im2col + GEMM on plain NCHW, like ours; blocked
**                  with reorders 0.62-1.41): ours.
**   float32 NHWC   fwd 1.81 / 1.99, bwd data 4.40 / 1.41, bwd weights 1.69 / 1.38
**                  against ours on NCHW copies: oneDNN, as the tensors are.
**   bfloat16 NCHW  fwd 0.81 / 1.00, bwd data 0.70 / 0.99, bwd weights 0.30 / 1.05
**                  against ours widened to float32: ours (the low-precision
**                  fallback at the conv entry).
**   bfloat16 NHWC  fwd 1.67 / 7.31, bwd data 2.49 / 7.30, bwd weights 4.17 / 6.08:
**                  oneDNN.
**   matmul         the MLP 512-2048-2048-10, batch 32: float32 3.3-9.9x and bfloat16
**                  8-21x faster in oneDNN for the 2048-wide layers, slower for the
**                  10-wide one (0.23-0.64) and for the batch-1 32-64-4 MLP (0.1-0.9):
**                  oneDNN from MATMUL_MIN_MACS multiply-adds up.
** The machine is shared, so single cases vary by 2x from run to run; the choices
** above held in two runs. */
enum { OP_FWD = 0, OP_BWD_DATA = 1, OP_BWD_WEIGHTS = 2, OP_MATMUL = 3 };
enum { DT_F32 = 0, DT_BF16 = 1 };
enum { LAY_NCHW = 0, LAY_NHWC = 1 };
enum { OURS = 0, PLAIN = 1, BLOCKED = 2 };
static const unsigned char policy[4][2][2] = {
  [OP_FWD] = {[DT_F32] = {OURS, PLAIN}, [DT_BF16] = {OURS, PLAIN}},
  [OP_BWD_DATA] = {[DT_F32] = {OURS, PLAIN}, [DT_BF16] = {OURS, PLAIN}},
  [OP_BWD_WEIGHTS] = {[DT_F32] = {OURS, PLAIN}, [DT_BF16] = {OURS, PLAIN}},
  [OP_MATMUL] = {[DT_F32] = {PLAIN, PLAIN}, [DT_BF16] = {PLAIN, PLAIN}},
};
/* Below this many multiply-adds a matmul stays ours in "auto" (the MLP's 32x2048x10
** layer, 0.66M, was faster ours; its 32x512x2048 one, 33M, in oneDNN). */
enum { MATMUL_MIN_MACS = 1 << 22 };
static __attribute__((unused)) const char *const op_names[] = {"conv2d forward", "conv2d backward data",
                                       "conv2d backward weights", "matmul"};

/* What serves (op, dt, layout) under the current mode: OURS, PLAIN or BLOCKED. */
static __attribute__((unused)) int choice(int op, int dt, int lay) {
  switch (mode_now()) {
  case MODE_OURS: return OURS;
  case MODE_ONEDNN: return PLAIN;
  case MODE_BLOCKED: return op == OP_MATMUL ? PLAIN : BLOCKED;
  default: return policy[op][dt][lay];
  }
}

#ifndef EMI_HAVE_DNNL

/* Built without oneDNN's header: everything declines. */
em_status emi_dnnl_conv2d(em_state *S, const emi_conv_geom *g, em_tensor *y,
                          const em_tensor *x, const em_tensor *w, const em_tensor *b,
                          bool *served) {
  *served = false;
  return EM_OK;
}
em_status emi_dnnl_conv2d_backward(em_state *S, const emi_conv_geom *g, em_tensor **gx,
                                   em_tensor **gw, em_tensor **gb, const em_tensor *gy,
                                   const em_tensor *x, const em_tensor *w) {
  return EM_OK;
}
em_status emi_dnnl_matmul(em_state *S, em_tensor *out, const em_tensor *a,
                          const em_tensor *b, bool *served) {
  *served = false;
  return EM_OK;
}
em_status em_cpu_kernels_info(char *buf, size_t len) {
  if (!buf || !len) return EM_ERR_ARG;
  snprintf(buf, len, "oneDNN: not built in (no oneapi/dnnl/dnnl.h at build time)\n"
           "conv2d: ember (GEMM on %s)\nmatmul: OpenBLAS / ember\n", emi_nn_sgemm_name());
  return EM_OK;
}

#else

/* -- Loading ------------------------------------------------------------------------ */

#define DNNL_FUNCS(X)                                                                    \
  X(dnnl_version) X(dnnl_get_effective_cpu_isa) X(dnnl_engine_create)                   \
  X(dnnl_stream_create) X(dnnl_stream_destroy) X(dnnl_stream_wait)                      \
  X(dnnl_memory_desc_init_by_strides) X(dnnl_memory_desc_init_by_tag)                   \
  X(dnnl_memory_desc_equal) X(dnnl_memory_desc_get_size) X(dnnl_memory_create)          \
  X(dnnl_memory_destroy) X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy)   \
  X(dnnl_primitive_attr_set_scratchpad_mode) X(dnnl_primitive_desc_create)              \
  X(dnnl_primitive_desc_destroy) X(dnnl_primitive_desc_query_md)                        \
  X(dnnl_primitive_desc_query) X(dnnl_primitive_create) X(dnnl_primitive_destroy)       \
  X(dnnl_primitive_execute) X(dnnl_reorder_primitive_desc_create)                       \
  X(dnnl_dilated_convolution_forward_desc_init)                                         \
  X(dnnl_dilated_convolution_backward_data_desc_init)                                   \
  X(dnnl_dilated_convolution_backward_weights_desc_init) X(dnnl_matmul_desc_init)

static struct {
#define FIELD(name) __typeof__(name) *name;
  DNNL_FUNCS(FIELD)
#undef FIELD
  void (*omp_set_num_threads)(int);
  void *handle;
  dnnl_engine_t engine;
  int ok;
  char why[320];          /* why not loaded, for --info */
  char version[32];
} L;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_key_t stream_key;

static void stream_free(void *s) {
  if (s) L.dnnl_stream_destroy((dnnl_stream_t)s);
}

static void load(void) {
#ifdef EMI_DNNL_SANITIZED
  snprintf(L.why, sizeof L.why, "a sanitizer build: libgomp is not instrumented");
  return;
#endif
  /* OpenMP reads this once, when libgomp starts: idle threads spin a little (the
  ** reorders and the primitive of one call follow each other) and then sleep,
  ** instead of libgomp's default 300000 spins that would keep a core from ember's
  ** workers. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) measured slower: every
  ** primitive then waits for a woken thread, and on a loaded machine that wait
  ** is long. */
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
    setenv("GOMP_SPINCOUNT", "20000", 0);
  char name[128];
  const char *lib = getenv("EMBER_DNNL_LIB");   /* another copy, or none (tests) */
  if (lib && *lib) snprintf(name, sizeof name, "%s", lib);
  else snprintf(name, sizeof name, "libdnnl.so.%d", DNNL_VERSION_MAJOR);
  L.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!L.handle) {
    snprintf(L.why, sizeof L.why, "%s not found (apt-get install libdnnl2)", name);
    return;
  }
#define LOOK(nm)                                                                         \
  if (!(L.nm = (__typeof__(nm) *)dlsym(L.handle, #nm))) {                                \
    snprintf(L.why, sizeof L.why, "%s lacks %s", name, #nm);                             \
    return;                                                                              \
  }
  DNNL_FUNCS(LOOK)
#undef LOOK
  L.omp_set_num_threads = (void (*)(int))dlsym(L.handle, "omp_set_num_threads");
  const dnnl_version_t *v = L.dnnl_version();
  snprintf(L.version, sizeof L.version, "%d.%d.%d", v->major, v->minor, v->patch);
  if (v->major != DNNL_VERSION_MAJOR) {
    snprintf(L.why, sizeof L.why, "%s is oneDNN %s, built for %d.x", name, L.version,
             DNNL_VERSION_MAJOR);
    return;
  }
  if (L.dnnl_engine_create(&L.engine, dnnl_cpu, 0) != dnnl_success) {
    snprintf(L.why, sizeof L.why, "oneDNN %s: no CPU engine", L.version);
    return;
  }
  if (pthread_key_create(&stream_key, stream_free)) {
    snprintf(L.why, sizeof L.why, "no thread key for oneDNN streams");
    return;
  }
  L.ok = 1;
}

static bool loaded(void) {
  pthread_once(&load_once, load);
  return L.ok;
}

static dnnl_stream_t my_stream(void) {
  dnnl_stream_t s = pthread_getspecific(stream_key);
  if (!s && L.dnnl_stream_create(&s, L.engine, dnnl_stream_default_flags) == dnnl_success)
    pthread_setspecific(stream_key, s);
  return s;
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
  switch ((int)isa) {
  case dnnl_cpu_isa_sse41: return "sse41";
  case dnnl_cpu_isa_avx: return "avx";
  case dnnl_cpu_isa_avx2: return "avx2";
  case dnnl_cpu_isa_avx512_core: return "avx512_core";
  case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
  case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
  case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
  default: return "isa?";
  }
}

/* -- Primitive cache ---------------------------------------------------------------- */

enum { MAX_SLOTS = 4, KEY_WORDS = 40 };

/* One tensor argument of a primitive: ember's layout (user) and the primitive's
** (want); a reorder between them when they differ (user -> want for inputs, want ->
** user for outputs). */
typedef struct slot {
  int arg, is_out;
  dnnl_memory_desc_t user, want;
  dnnl_primitive_t reorder;   /* NULL: the primitive reads ember's memory as it is */
  size_t want_bytes;
} slot;

typedef struct entry {
  int64_t key[KEY_WORDS];
  dnnl_primitive_t prim;      /* NULL: oneDNN has no kernel for it (declined) */
  dnnl_memory_desc_t scratch;
  size_t scratch_bytes;
  int nslots;
  slot s[MAX_SLOTS];
  char impl[48];
  struct entry *next;
} entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static entry *cache;
static int64_t cache_size;

static entry *cache_find(const int64_t *key) {
  for (entry *e = cache; e; e = e->next)
    if (!memcmp(e->key, key, sizeof e->key)) return e;
  return NULL;
}

/* Fills e's slots' want descriptors and reorders from its primitive desc. */
static bool finish_entry(entry *e, dnnl_primitive_desc_t pd, const dnnl_query_t *q,
                         const int *qi) {
  for (int i = 0; i < e->nslots; i++) {
    slot *s = &e->s[i];
    const dnnl_memory_desc_t *md = L.dnnl_primitive_desc_query_md(pd, q[i], qi[i]);
    if (!md) return false;
    s->want = *md;
    s->want_bytes = L.dnnl_memory_desc_get_size(md);
    if (L.dnnl_memory_desc_equal(&s->user, &s->want)) continue;
    dnnl_primitive_desc_t rpd = NULL;
    const dnnl_memory_desc_t *from = s->is_out ? &s->want : &s->user;
    const dnnl_memory_desc_t *to = s->is_out ? &s->user : &s->want;
    if (L.dnnl_reorder_primitive_desc_create(&rpd, from, L.engine, to, L.engine, NULL) !=
        dnnl_success)
      return false;
    dnnl_status_t st = L.dnnl_primitive_create(&s->reorder, rpd);
    L.dnnl_primitive_desc_destroy(rpd);
    if (st != dnnl_success) return false;
  }
  const dnnl_memory_desc_t *sm = L.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (sm) {
    e->scratch = *sm;
    e->scratch_bytes = L.dnnl_memory_desc_get_size(sm);
  }
  const char *impl = NULL;
  if (L.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
      impl)
    snprintf(e->impl, sizeof e->impl, "%s", impl);
  return L.dnnl_primitive_create(&e->prim, pd) == dnnl_success;
}

/* Makes the primitive for op_desc (a oneDNN op descriptor) with e's slots; on any
** failure e->prim stays NULL (the case is declined from then on). */
static void make_entry(entry *e, const void *op_desc, const void *hint_desc,
                       const dnnl_query_t *q, const int *qi) {
  dnnl_primitive_attr_t attr = NULL;
  dnnl_primitive_desc_t hint = NULL, pd = NULL;
  if (L.dnnl_primitive_attr_create(&attr) != dnnl_success) return;
  L.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (hint_desc &&
      L.dnnl_primitive_desc_create(&hint, hint_desc, attr, L.engine, NULL) != dnnl_success)
    goto out;
  if (L.dnnl_primitive_desc_create(&pd, op_desc, attr, L.engine, hint) != dnnl_success)
    goto out;
  if (!finish_entry(e, pd, q, qi)) {
    for (int i = 0; i < e->nslots; i++)
      if (e->s[i].reorder) L.dnnl_primitive_destroy(e->s[i].reorder), e->s[i].reorder = NULL;
    if (e->prim) L.dnnl_primitive_destroy(e->prim);
    e->prim = NULL;
  }
out:
  if (pd) L.dnnl_primitive_desc_destroy(pd);
  if (hint) L.dnnl_primitive_desc_destroy(hint);
  L.dnnl_primitive_attr_destroy(attr);
}

/* Runs e on ember's buffers ptr[i] (one per slot; NULL slots are skipped by the
** caller never making them). Reorder buffers and the scratchpad come from ember. */
static em_status run_entry(em_state *S, const char *op, entry *e, void *const *ptr) {
  dnnl_stream_t stream = my_stream();
  if (!stream) return emi_error(S, EM_ERR_INTERNAL, "%s: oneDNN: no stream", op);
  void *buf[MAX_SLOTS] = {0};
  dnnl_memory_t mem[MAX_SLOTS + 1] = {0}, umem[MAX_SLOTS] = {0};
  dnnl_exec_arg_t args[MAX_SLOTS + 1];
  void *scratch = NULL;
  em_status st = EM_OK;
  dnnl_status_t ds = dnnl_success;
  int nargs = 0;
  for (int i = 0; i < e->nslots; i++) {
    slot *s = &e->s[i];
    void *p = ptr[i];
    if (s->reorder) {
      if (!(buf[i] = emi_malloc(S, s->want_bytes))) goto nomem;
      if ((ds = L.dnnl_memory_create(&umem[i], &s->user, L.engine, ptr[i]))) goto fail;
      p = buf[i];
    }
    if ((ds = L.dnnl_memory_create(&mem[i], &s->want, L.engine, p))) goto fail;
    args[nargs++] = (dnnl_exec_arg_t){s->arg, mem[i]};
  }
  if (e->scratch_bytes) {
    if (!(scratch = emi_malloc(S, e->scratch_bytes))) goto nomem;
    if ((ds = L.dnnl_memory_create(&mem[MAX_SLOTS], &e->scratch, L.engine, scratch)))
      goto fail;
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[MAX_SLOTS]};
  }
  if (L.omp_set_num_threads) L.omp_set_num_threads(S->num_threads > 0 ? S->num_threads : 1);
  for (int i = 0; i < e->nslots; i++)
    if (e->s[i].reorder && !e->s[i].is_out) {
      dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, umem[i]}, {DNNL_ARG_TO, mem[i]}};
      if ((ds = L.dnnl_primitive_execute(e->s[i].reorder, stream, 2, ra))) goto fail;
    }
  if ((ds = L.dnnl_primitive_execute(e->prim, stream, nargs, args))) goto fail;
  for (int i = 0; i < e->nslots; i++)
    if (e->s[i].reorder && e->s[i].is_out) {
      dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, mem[i]}, {DNNL_ARG_TO, umem[i]}};
      if ((ds = L.dnnl_primitive_execute(e->s[i].reorder, stream, 2, ra))) goto fail;
    }
  if ((ds = L.dnnl_stream_wait(stream))) goto fail;
  goto done;
nomem:
  st = emi_error(S, EM_ERR_NOMEM, "%s: out of memory for oneDNN's buffers", op);
  goto done;
fail:
  st = emi_error(S, EM_ERR_INTERNAL, "%s: oneDNN failed (status %d)", op, (int)ds);
done:
  for (int i = 0; i <= MAX_SLOTS; i++)
    if (mem[i]) L.dnnl_memory_destroy(mem[i]);
  for (int i = 0; i < e->nslots; i++) {
    if (umem[i]) L.dnnl_memory_destroy(umem[i]);
    if (buf[i]) emi_free(S, buf[i], e->s[i].want_bytes);
  }
  if (scratch) emi_free(S, scratch, e->scratch_bytes);
  return st;
}

/* -- Layouts ----------------------------------------------------------------------- */

static int dt_index(em_dtype dt) {
  return dt == EM_FLOAT32 ? DT_F32 : dt == EM_BFLOAT16 ? DT_BF16 : -1;
}
static dnnl_data_type_t dnnl_dt(em_dtype dt) {
  return dt == EM_FLOAT32 ? dnnl_f32 : dnnl_bf16;
}

/* Whether t's strides are those of a dense tensor whose dims, from the outermost,
** are in the order perm (a dim of size 1 may have any stride). */
static bool dense_in_order(const em_tensor *t, const int *perm, int n) {
  int64_t want = 1;
  for (int i = n - 1; i >= 0; i--) {
    int d = perm[i];
    if (t->sizes[d] != 1 && t->strides[d] != want) return false;
    want *= t->sizes[d];
  }
  return true;
}

/* LAY_NCHW, LAY_NHWC, or -1 for other strides (declined). */
static int layout_of(const em_tensor *t) {
  static const int nchw[4] = {0, 1, 2, 3}, nhwc[4] = {0, 2, 3, 1};
  if (dense_in_order(t, nchw, 4)) return LAY_NCHW;
  if (dense_in_order(t, nhwc, 4)) return LAY_NHWC;
  return -1;
}

/* A descriptor with t's own strides (4-D), or "any" when any is set. */
static bool act_md(dnnl_memory_desc_t *md, const em_tensor *t, bool any) {
  dnnl_dims_t dims = {t->sizes[0], t->sizes[1], t->sizes[2], t->sizes[3]};
  if (any) return L.dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_dt(t->dtype),
                                                 dnnl_format_tag_any) == dnnl_success;
  dnnl_dims_t st = {t->strides[0], t->strides[1], t->strides[2], t->strides[3]};
  return L.dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_dt(t->dtype), st) ==
         dnnl_success;
}

/* Weights (O, C/G, kH, kW) as oneDNN wants them: 5-D (G, O/G, C/G, kH, kW) with
** groups. */
static bool w_md(dnnl_memory_desc_t *md, const em_tensor *w, int64_t G, bool any) {
  dnnl_dims_t dims, st;
  int n = G > 1 ? 5 : 4;
  if (G > 1) {
    int64_t og = w->sizes[0] / G;
    int64_t d5[5] = {G, og, w->sizes[1], w->sizes[2], w->sizes[3]};
    int64_t s5[5] = {w->strides[0] * og, w->strides[0], w->strides[1], w->strides[2],
                     w->strides[3]};
    memcpy(dims, d5, sizeof d5);
    memcpy(st, s5, sizeof s5);
  } else {
    for (int i = 0; i < 4; i++) dims[i] = w->sizes[i], st[i] = w->strides[i];
  }
  if (any) return L.dnnl_memory_desc_init_by_tag(md, n, dims, dnnl_dt(w->dtype),
                                                 dnnl_format_tag_any) == dnnl_success;
  return L.dnnl_memory_desc_init_by_strides(md, n, dims, dnnl_dt(w->dtype), st) ==
         dnnl_success;
}

static bool bias_md(dnnl_memory_desc_t *md, const em_tensor *b) {
  dnnl_dims_t dims = {b->sizes[0]}, st = {b->strides[0]};
  return L.dnnl_memory_desc_init_by_strides(md, 1, dims, dnnl_dt(b->dtype), st) ==
         dnnl_success;
}

/* -- Convolution ------------------------------------------------------------------- */

static void conv_key(int64_t *k, int op, int pol, const emi_conv_geom *g,
                     const em_tensor *const *t, int nt) {
  memset(k, 0, sizeof(int64_t) * KEY_WORDS);
  int64_t v[] = {op, pol, g->N, g->C, g->H, g->W, g->O, g->kH, g->kW, g->sH, g->sW,
                 g->pH, g->pW, g->dH, g->dW, g->G};
  int n = (int)(sizeof v / sizeof v[0]);
  memcpy(k, v, sizeof v);
  for (int i = 0; i < nt; i++) {
    k[n++] = t[i] ? t[i]->dtype + 1 : 0;
    if (t[i]) for (int d = 0; d < t[i]->ndim; d++) k[n++] = t[i]->strides[d];
    else n += 4;
  }
}

static void conv_dims(const emi_conv_geom *g, dnnl_dims_t s, dnnl_dims_t d, dnnl_dims_t pl,
                      dnnl_dims_t pr) {
  s[0] = g->sH, s[1] = g->sW;
  d[0] = g->dH - 1, d[1] = g->dW - 1;
  pl[0] = g->pH, pl[1] = g->pW;
  /* the right padding that makes oneDNN's output size ember's (floor) */
  pr[0] = (g->OH - 1) * g->sH + (g->kH - 1) * g->dH + 1 - g->H - g->pH;
  pr[1] = (g->OW - 1) * g->sW + (g->kW - 1) * g->dW + 1 - g->W - g->pW;
}

/* The forward descriptor for the given tensors' descriptors (the backward ones need
** it as a hint). */
static bool fwd_desc(dnnl_convolution_desc_t *cd, const emi_conv_geom *g,
                     const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                     const dnnl_memory_desc_t *bia, const dnnl_memory_desc_t *dst) {
  dnnl_dims_t s, d, pl, pr;
  conv_dims(g, s, d, pl, pr);
  return L.dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training,
                                                      dnnl_convolution_direct, src, wei,
                                                      bia, dst, s, d, pl, pr) ==
         dnnl_success;
}

/* Finds or makes the cache entry for key, building it with build(e, ctx). */
typedef void (*build_fn)(entry *e, void *ctx);
static entry *get_entry(const int64_t *key, build_fn build, void *ctx) {
  pthread_mutex_lock(&cache_mu);
  entry *e = cache_find(key);
  if (!e && (e = calloc(1, sizeof *e))) {
    memcpy(e->key, key, sizeof e->key);
    build(e, ctx);   /* under the lock: two threads never make the same primitive */
    e->next = cache;
    cache = e;
    cache_size++;
  }
  pthread_mutex_unlock(&cache_mu);
  return e;
}

typedef struct conv_ctx {
  int op;
  bool act_any;
  const emi_conv_geom *g;
  const em_tensor *x, *w, *b, *y;   /* y: the output, or gy for the backward */
} conv_ctx;

static void build_conv(entry *e, void *vc) {
  conv_ctx *c = vc;
  const emi_conv_geom *g = c->g;
  dnnl_memory_desc_t src, wei, bia, dst, src_any, dst_any, wei_any;
  bool hb = c->b != NULL;
  if (!act_md(&src, c->x, false) || !act_md(&dst, c->y, false) ||
      !act_md(&src_any, c->x, true) || !act_md(&dst_any, c->y, true) ||
      !w_md(&wei, c->w, g->G, false) || !w_md(&wei_any, c->w, g->G, true) ||
      (hb && !bias_md(&bia, c->b)))
    return;
  const dnnl_memory_desc_t *ps = c->act_any ? &src_any : &src,
                           *pd = c->act_any ? &dst_any : &dst;
  dnnl_convolution_desc_t fwd, cd;
  dnnl_dims_t s, d, pl, pr;
  conv_dims(g, s, d, pl, pr);
  dnnl_query_t q[4];
  int qi[4] = {0, 0, 0, 0};
  e->nslots = 0;
  /* slot order: src-like, weights-like, dst-like, bias-like */
  if (c->op == OP_FWD) {
    if (!fwd_desc(&cd, g, ps, &wei_any, hb ? &bia : NULL, pd)) return;
    e->s[0] = (slot){.arg = DNNL_ARG_SRC, .user = src};
    e->s[1] = (slot){.arg = DNNL_ARG_WEIGHTS, .user = wei};
    e->s[2] = (slot){.arg = DNNL_ARG_DST, .is_out = 1, .user = dst};
    q[0] = dnnl_query_src_md, q[1] = dnnl_query_weights_md, q[2] = dnnl_query_dst_md;
    e->nslots = 3;
    if (hb) {
      e->s[3] = (slot){.arg = DNNL_ARG_BIAS, .user = bia};
      q[3] = dnnl_query_weights_md, qi[3] = 1;
      e->nslots = 4;
    }
    make_entry(e, &cd, NULL, q, qi);
  } else if (c->op == OP_BWD_DATA) {
    /* x here is gx (the output) and y is gy */
    if (!fwd_desc(&fwd, g, ps, &wei_any, NULL, pd)) return;
    if (L.dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, ps,
                                                           &wei_any, pd, s, d, pl, pr))
      return;
    e->s[0] = (slot){.arg = DNNL_ARG_DIFF_SRC, .is_out = 1, .user = src};
    e->s[1] = (slot){.arg = DNNL_ARG_WEIGHTS, .user = wei};
    e->s[2] = (slot){.arg = DNNL_ARG_DIFF_DST, .user = dst};
    q[0] = dnnl_query_diff_src_md, q[1] = dnnl_query_weights_md, q[2] = dnnl_query_diff_dst_md;
    e->nslots = 3;
    make_entry(e, &cd, &fwd, q, qi);
  } else {
    /* w here is gw (an output) and b is gb */
    if (!fwd_desc(&fwd, g, ps, &wei_any, hb ? &bia : NULL, pd)) return;
    if (L.dnnl_dilated_convolution_backward_weights_desc_init(
            &cd, dnnl_convolution_direct, ps, &wei_any, hb ? &bia : NULL, pd, s, d, pl, pr))
      return;
    e->s[0] = (slot){.arg = DNNL_ARG_SRC, .user = src};
    e->s[1] = (slot){.arg = DNNL_ARG_DIFF_WEIGHTS, .is_out = 1, .user = wei};
    e->s[2] = (slot){.arg = DNNL_ARG_DIFF_DST, .user = dst};
    q[0] = dnnl_query_src_md, q[1] = dnnl_query_diff_weights_md, q[2] = dnnl_query_diff_dst_md;
    e->nslots = 3;
    if (hb) {
      e->s[3] = (slot){.arg = DNNL_ARG_DIFF_BIAS, .is_out = 1, .user = bia};
      q[3] = dnnl_query_diff_weights_md, qi[3] = 1;
      e->nslots = 4;
    }
    make_entry(e, &cd, &fwd, q, qi);
  }
}

/* The case's choice, or OURS when the tensors are not ones oneDNN is given. */
static int conv_choice(int op, const em_tensor *x, const em_tensor *const *others, int n) {
  int dt = dt_index(x->dtype), lay = layout_of(x);
  if (dt < 0 || lay < 0) return OURS;
  for (int i = 0; i < n; i++) {
    if (!others[i]) continue;
    if (others[i]->dtype != x->dtype) return OURS;
    if (others[i]->ndim == 4 && layout_of(others[i]) < 0) return OURS;
  }
  int c = choice(op, dt, lay);
  if (c != OURS && !loaded()) return OURS;
  return c;
}

static em_status conv_run(em_state *S, const char *opname, conv_ctx *c, int pol,
                          void *const *ptr, bool *served) {
  const em_tensor *t[4] = {c->x, c->w, c->b, c->y};
  int64_t key[KEY_WORDS];
  c->act_any = pol == BLOCKED;
  conv_key(key, c->op, pol, c->g, t, 4);
  entry *e = get_entry(key, build_conv, c);
  *served = false;
  if (!e) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory for a oneDNN cache entry",
                           opname);
  if (!e->prim) return EM_OK;   /* no oneDNN kernel for it: ours */
  *served = true;
  return run_entry(S, opname, e, ptr);
}

em_status emi_dnnl_conv2d(em_state *S, const emi_conv_geom *g, em_tensor *y,
                          const em_tensor *x, const em_tensor *w, const em_tensor *b,
                          bool *served) {
  *served = false;
  const em_tensor *o[3] = {w, b, y};
  int pol = conv_choice(OP_FWD, x, o, 3);
  if (pol == OURS) return EM_OK;
  conv_ctx c = {.op = OP_FWD, .g = g, .x = x, .w = w, .b = b, .y = y};
  void *ptr[4] = {em_tensor_data(x), em_tensor_data(w), em_tensor_data(y),
                  b ? em_tensor_data(b) : NULL};
  return conv_run(S, "conv2d", &c, pol, ptr, served);
}

em_status emi_dnnl_conv2d_backward(em_state *S, const emi_conv_geom *g, em_tensor **gx,
                                   em_tensor **gw, em_tensor **gb, const em_tensor *gy,
                                   const em_tensor *x, const em_tensor *w) {
  em_status st = EM_OK;
  bool served = false;
  if (*gx) {
    const em_tensor *o[3] = {*gx, w, gy};
    int pol = conv_choice(OP_BWD_DATA, x, o, 3);
    if (pol != OURS) {
      conv_ctx c = {.op = OP_BWD_DATA, .g = g, .x = *gx, .w = w, .y = gy};
      void *ptr[3] = {em_tensor_data(*gx), em_tensor_data(w), em_tensor_data(gy)};
      if ((st = conv_run(S, "conv2d_backward", &c, pol, ptr, &served))) return st;
      if (served) *gx = NULL;
    }
  }
  if (*gw) {
    const em_tensor *o[3] = {*gw, *gb, gy};
    int pol = conv_choice(OP_BWD_WEIGHTS, x, o, 3);
    if (pol != OURS) {
      conv_ctx c = {.op = OP_BWD_WEIGHTS, .g = g, .x = x, .w = *gw, .b = *gb, .y = gy};
      void *ptr[4] = {em_tensor_data(x), em_tensor_data(*gw), em_tensor_data(gy),
                      *gb ? em_tensor_data(*gb) : NULL};
      if ((st = conv_run(S, "conv2d_backward", &c, pol, ptr, &served))) return st;
      if (served) *gw = NULL, *gb = NULL;
    }
  }
  return EM_OK;
}

/* -- Matmul ------------------------------------------------------------------------ */

typedef struct mm_ctx {
  const em_tensor *a, *b, *out;
} mm_ctx;

static bool mat_md(dnnl_memory_desc_t *md, const em_tensor *t) {
  dnnl_dims_t dims = {t->sizes[0], t->sizes[1]}, st = {t->strides[0], t->strides[1]};
  return L.dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_dt(t->dtype), st) ==
         dnnl_success;
}

static void build_mm(entry *e, void *vc) {
  mm_ctx *c = vc;
  dnnl_memory_desc_t a, b, o;
  dnnl_matmul_desc_t md;
  if (!mat_md(&a, c->a) || !mat_md(&b, c->b) || !mat_md(&o, c->out)) return;
  if (L.dnnl_matmul_desc_init(&md, &a, &b, NULL, &o)) return;
  e->s[0] = (slot){.arg = DNNL_ARG_SRC, .user = a};
  e->s[1] = (slot){.arg = DNNL_ARG_WEIGHTS, .user = b};
  e->s[2] = (slot){.arg = DNNL_ARG_DST, .is_out = 1, .user = o};
  e->nslots = 3;
  dnnl_query_t q[3] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md};
  int qi[3] = {0, 0, 0};
  make_entry(e, &md, NULL, q, qi);
}

/* A 2-D operand oneDNN reads as it is: one of its strides 1, the other positive. */
static bool mat_ok(const em_tensor *t) {
  return t->ndim == 2 && t->strides[0] > 0 && t->strides[1] > 0 &&
         (t->strides[0] == 1 || t->strides[1] == 1);
}

em_status emi_dnnl_matmul(em_state *S, em_tensor *out, const em_tensor *a,
                          const em_tensor *b, bool *served) {
  *served = false;
  int dt = dt_index(out->dtype);
  if (dt < 0 || a->dtype != out->dtype || b->dtype != out->dtype || !mat_ok(a) ||
      !mat_ok(b) || !mat_ok(out) || out->strides[1] != 1)
    return EM_OK;
  int c = choice(OP_MATMUL, dt, 0);
  if (mode_now() == MODE_AUTO && out->sizes[0] * out->sizes[1] * a->sizes[1] < MATMUL_MIN_MACS)
    c = OURS;
  if (c == OURS || !loaded()) return EM_OK;
  int64_t key[KEY_WORDS] = {OP_MATMUL, dt, out->sizes[0], out->sizes[1], a->sizes[1],
                            a->strides[0], a->strides[1], b->strides[0], b->strides[1],
                            out->strides[0]};
  mm_ctx ctx = {a, b, out};
  entry *e = get_entry(key, build_mm, &ctx);
  if (!e) return emi_error(S, EM_ERR_NOMEM, "matmul: out of memory for a oneDNN cache entry");
  if (!e->prim) return EM_OK;
  *served = true;
  void *ptr[3] = {em_tensor_data(a), em_tensor_data(b), em_tensor_data(out)};
  return run_entry(S, "matmul", e, ptr);
}

/* -- Information ------------------------------------------------------------------- */

em_status em_cpu_kernels_info(char *buf, size_t len) {
  if (!buf || !len) return EM_ERR_ARG;
  size_t n = 0;
#define PUT(...)                                                                         \
  do {                                                                                   \
    int k = snprintf(buf + n, n < len ? len - n : 0, __VA_ARGS__);                       \
    if (k > 0) n += (size_t)k;                                                           \
  } while (0)
  bool ok = loaded();
  const char *isa = ok ? isa_name(L.dnnl_get_effective_cpu_isa()) : "";
  if (ok) PUT("oneDNN %s (%s, OpenMP), mode %s\n", L.version, isa, em_cpu_kernels_get());
  else PUT("oneDNN: not used (%s)\n", L.why);
  static const char *const dts[2] = {"float32", "bfloat16"}, *const lays[2] = {"NCHW", "NHWC"};
  char conv_ours[96];
  snprintf(conv_ours, sizeof conv_ours, "ember (GEMM on %s)", emi_nn_sgemm_name());
  for (int op = 0; op < 4; op++)
    for (int dt = 0; dt < 2; dt++)
      for (int lay = 0; lay < (op == OP_MATMUL ? 1 : 2); lay++) {
        int c = ok ? choice(op, dt, lay) : OURS;
        const char *ours = op == OP_MATMUL
                               ? (dt == DT_F32 ? "OpenBLAS / ember (small)"
                                               : "OpenBLAS in float32")
                               : (dt == DT_F32 ? (lay == LAY_NCHW ? conv_ours
                                                                  : "ember (on an NCHW copy)")
                                               : "ember in float32 (widened)");
        if (op == OP_MATMUL)
          PUT("%s %s: ", op_names[op], dts[dt]);
        else
          PUT("%s %s %s: ", op_names[op], dts[dt], lays[lay]);
        bool no_bf16 = ok && dt == DT_BF16 && op != OP_MATMUL &&
                       (int)L.dnnl_get_effective_cpu_isa() < (int)dnnl_cpu_isa_avx512_core;
        if (c == OURS) PUT("%s\n", ours);
        else if (no_bf16) PUT("oneDNN has no kernel before AVX-512: %s\n", ours);
        else PUT("oneDNN %s (%s%s)%s\n", L.version, isa, c == BLOCKED ? ", blocked" : "",
                 op == OP_MATMUL && mode_now() == MODE_AUTO
                     ? "; below 4M multiply-adds: OpenBLAS / ember" : "");
      }
  PUT("oneDNN primitives cached: %lld\n", (long long)cache_size);
#undef PUT
  if (n >= len) buf[len - 1] = 0;
  return EM_OK;
}

#endif
