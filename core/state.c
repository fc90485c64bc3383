/*
** state.c -- em_state: opening and closing, the allocator hook, memory
** accounting and error messages. Every other file reaches the allocator and
** reports errors only through the functions here.
*/
#include "internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* -- Allocator -------------------------------------------------------------- */

static void *default_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud; (void)osize;
  if (nsize == 0) { free(ptr); return NULL; }
  return realloc(ptr, nsize);
}

/* A refusal raises the memory pressure flag, as a device or the CPU cap running
** out does: the host's allocator may be counting garbage tensors that only Lua's
** collector frees, so the Lua layer collects and retries the op once
** (em_memory_pressure_flag) -- a node autograd could not record, or a tensor
** header, included, not only tensor storage. */
void *emi_malloc(em_state *S, size_t n) {
  void *p = S->alloc(S->alloc_ud, NULL, 0, n ? n : 1);
  if (!p) __atomic_store_n(&S->memory_pressure, 1, __ATOMIC_RELAXED);
  return p;
}

void emi_free(em_state *S, void *p, size_t n) {
  if (p) S->alloc(S->alloc_ud, p, n ? n : 1, 0);
}

/* -- Open / close ------------------------------------------------------------- */

void em_config_init(em_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
}

em_status em_open(em_state **out, const em_config *cfg) {
  em_config def;
  if (!out) return EM_ERR_ARG;
  *out = NULL;
  if (!cfg) { em_config_init(&def); cfg = &def; }
  em_alloc_fn alloc = cfg->alloc ? cfg->alloc : default_alloc;
  em_state *S = alloc(cfg->alloc_ud, NULL, 0, sizeof *S);
  if (!S) return EM_ERR_NOMEM;
  memset(S, 0, sizeof *S);
  S->alloc = alloc;
  S->alloc_ud = cfg->alloc_ud;
  S->cpu = (emi_device){S, EM_CPU, &emi_cpu_backend, NULL};
  S->meta = (emi_device){S, EM_META, &emi_meta_backend, NULL};
  S->rng_seed = cfg->seed;
  emi_set_grad_disabled(S, 0);
  S->cache_limit = cfg->cache_limit < 0 ? 0
                 : cfg->cache_limit == 0 ? (size_t)512 << 20 : (size_t)cfg->cache_limit;
  pthread_mutex_init(&S->cache_mu, NULL);
  int n = cfg->num_threads;
  if (n <= 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    n = c > 0 ? (int)c : 1;
  }
  em_status st = em_set_num_threads(S, n);
  if (st != EM_OK) {
    pthread_mutex_destroy(&S->cache_mu);
    alloc(cfg->alloc_ud, S, sizeof *S, 0);
    return st;
  }
  *out = S;
  return EM_OK;
}

void em_close(em_state *S) {
  if (!S) return;
  emi_backward_callbacks_free(S);
  emi_ag_probe_free(S);
  emi_profile_free(S);
  emi_devices_close(S);
  emi_workers_free(S->workers);
  emi_cache_release(S);
  pthread_mutex_destroy(&S->cache_mu);
  S->alloc(S->alloc_ud, S, sizeof *S, 0);
}

/* n-1 workers: the calling thread does a share of each job. A state always has
** its workers object (with none for n = 1): it also holds the state's wish for
** OpenBLAS's process-wide thread count (cpu/blas.c). */
em_status em_set_num_threads(em_state *S, int n) {
  if (n < 1) return emi_error(S, EM_ERR_ARG, "set_num_threads: need at least 1 thread, got %d", n);
  if (S->workers && emi_workers_size(S->workers) == n) return EM_OK;
  emi_workers *w = emi_workers_new(S, n);
  if (!w) return emi_error(S, EM_ERR_NOMEM, "set_num_threads: could not start %d threads", n);
  emi_workers_free(S->workers);
  S->workers = w;
  S->num_threads = n;
  return EM_OK;
}

int em_get_num_threads(em_state *S) { return S->num_threads; }

/* Loader workers allocate concurrently: the counters are read atomically. */
int64_t em_memory_allocated(em_state *S) {
  return __atomic_load_n(&S->mem_allocated, __ATOMIC_RELAXED);
}
int64_t em_memory_peak(em_state *S) { return __atomic_load_n(&S->mem_peak, __ATOMIC_RELAXED); }

const char *em_version(void) { return "0.1.0"; }

double emi_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -- Errors --------------------------------------------------------------------- */

const char *em_errmsg(em_state *S) {
  return S ? S->errmsg : "ember: no state (em_open failed or was not called)";
}

em_status emi_error(em_state *S, em_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(S->errmsg, sizeof S->errmsg, fmt, ap);
  va_end(ap);
  return code;
}

const char *emi_shape_str(char *buf, const int64_t *sizes, int ndim) {
  char *p = buf;
  *p++ = '[';
  for (int i = 0; i < ndim; i++)
    p += sprintf(p, i ? ",%lld" : "%lld", (long long)sizes[i]);
  *p++ = ']';
  *p = 0;
  return buf;
}

const char *emi_tshape(em_state *S, const em_tensor *t) {
  /* Rotating buffers: a message quotes up to four shapes, and is formatted and
  ** copied at once. They are thread-local, not per state: states on two threads
  ** format their messages at the same time. */
  static __thread char bufs[4][EMI_SHAPE_STR];
  static __thread int next;
  (void)S;
  char *b = bufs[next++ & 3];
  return t ? emi_shape_str(b, t->sizes, t->ndim) : "(nil)";
}


em_status emi_no_kernel(em_state *S, const char *op, const char *entry, int device) {
  char b[32];
  emi_device *d = emi_device_of(S, device);
  if (!d)
    return emi_error(S, EM_ERR_DEVICE, "%s: no backend serves device %s (ember was built "
                     "without it, or it is not present)", op, emi_device_name(b, device));
  return emi_error(S, EM_ERR_DEVICE, "%s: the %s backend has no '%s' kernel (device %s)",
                   op, d->backend->name, entry, emi_device_name(b, device));
}

em_status emi_check_tensor(em_state *S, const char *op, const em_tensor *t) {
  if (!t) return emi_error(S, EM_ERR_ARG, "%s: expected a tensor, got NULL", op);
  return EM_OK;
}

/* How messages number dims, positions and indices: the caller's numbering rather
** than a rewrite of the text afterwards (emi_ix). */
em_status em_set_index_base(em_state *S, int base) {
  if (base != 0 && base != 1)
    return emi_error(S, EM_ERR_ARG, "set_index_base: the base must be 0 or 1, got %d", base);
  S->index_base = base;
  return EM_OK;
}
int em_get_index_base(em_state *S) { return S->index_base; }

long long emi_ix(const em_state *S, long long v) { return v < 0 ? v : v + S->index_base; }

void emi_host_allocator(em_state *S, em_alloc_fn *fn, void **ud) {
  *fn = S->alloc;
  *ud = S->alloc_ud;
}

em_status emi_wrap_dim(em_state *S, const char *op, int *dim, int ndim) {
  int d = *dim, n = ndim > 0 ? ndim : 1;
  if (d < -n || d >= n)
    return emi_error(S, EM_ERR_INDEX,
                     "%s: dimension %lld out of range for a %d-D tensor (dims count from %d)",
                     op, emi_ix(S, d), ndim, S->index_base);
  *dim = d < 0 ? d + n : d;
  return EM_OK;
}

/* What this build has. */
const char *em_build_info(void) {
  return "backend cpu: OpenBLAS (pthreads), float16/bfloat16 computed in float32\n"
         "backend meta: shapes, dtypes and allocations, no data\n"
         "backend cuda (libember_cuda.so, loaded on first use): on GPUs, ember's kernels "
         "(nvcc) for tensor ops, pooling and evaluation batch norm, float GEMM on cuBLASLt, "
         "convolution and training batch norm on cuDNN, collectives on NCCL; on emulated "
         "devices (EMBER_CUDA_EMULATE=N[:MB]), the same kernels on the grid emulator and "
         "CPU stand-ins for cuBLASLt, cuDNN and NCCL\n";
}
