/*
** device.h -- one kernel source for nvcc and for the grid emulator.
**
** A kernel family of the CUDA backend is written once, in a kernels/k_*.cu file
** with these macros, and compiled twice: by nvcc as CUDA C++ (__CUDACC__
** defined, sm_80/sm_90) into a fatbin of __global__ functions, and by the host
** C++ compiler into functions the grid emulator (kernels/emu/grid.c) runs once
** per CUDA thread, each thread a fiber. (A C file may define kernels too, as the
** emulator's tests do.) A kernel takes one argument struct, by value:
**
**     typedef struct { const float *x; float *y; int n; } scale_args;
**     // y is (n,), x is (n,)
**     EMK_KERNEL(k_scale, scale_args) {
**       int i = blockIdx.x * blockDim.x + threadIdx.x;
**       if (i < a.n) a.y[i] = 2 * a.x[i];
**     }
**
** which defines the descriptor `k_scale` (an emk_kernel, runtime.h) that the
** runtime's launch takes: in a .cu, with C linkage for the C launchers, which
** declare it with EMK_KERNEL_DECL; in a C file, static. Dtype variants are
** templates the kernels call; the kernels themselves are plain functions, so
** their names stay unmangled. In the body `a` is a const copy of the arguments, and
** threadIdx, blockIdx, blockDim, gridDim are the current thread's, as in CUDA.
**
** A kernel that calls EMK_SYNCTHREADS(), EMK_SYNCWARP() or any warp operation
** (shuffles, votes) must be declared EMK_KERNEL_SYNC: on the emulator only those
** kernels get fibers; the others run each thread to completion as a plain call,
** which is many times faster. A plain EMK_KERNEL that reaches a barrier anyway
** fails its launch with an error naming it (it never hangs).
**
** The rest maps one name to both worlds:
**   EMK_SYNCTHREADS()                     __syncthreads()
**   EMK_SYNCWARP(mask)                    __syncwarp(mask)
**   emk_shfl_{down,up,xor}_sync(m, v, d)  __shfl_*_sync, width 32 (`_w` forms
**   emk_shfl_sync(m, v, lane)             take a width); v is float, double or
**                                         any integer type up to 64 bits
**   emk_ballot_sync / emk_any_sync / emk_all_sync
**   emk_atomic_add_{f32,f64,i32,u32,i64}  atomicAdd, returns the old value;
**   emk_atomic_{max,min}_i32, emk_atomic_cas_{i32,i64}
**   EMK_SHARED(type, name, count)         __shared__ type name[count]
**   EMK_SHARED_2D(type, name, rows, cols) __shared__ type name[rows][cols]
**   EMK_DYN_SHARED(type, name)            extern __shared__ type name[]
**   EMK_DEVICE                            __device__ __forceinline__ helpers
**   emk_float4                            float4 (16-byte loads and stores)
** Differences a kernel must not rely on: on the host a shared array is a
** pointer (sizeof differs), and its storage is given out when the declaration
** first runs in a launch. No inline PTX; the warp size is 32.
**
** The emulator's contract (grid.c): blocks run one after another in a fixed
** order; shared memory is poisoned (EMK_SHARED_POISON bytes) at each block start,
** so reading what no thread wrote yet gives garbage; a block's threads run in
** thread order up to their next barrier or warp operation, so a missing
** EMK_SYNCTHREADS between a write and a later thread's read makes the reader see
** the poison, deterministically (EMBER_EMU_SCHEDULE=reverse runs them the other
** way, for reads of an earlier thread's writes). A barrier that only some of a
** block's threads reach, and warp operations whose lanes disagree or exited,
** fail the launch with a message instead of hanging. Atomics are real atomics.
*/
/* Limits the emulator enforces and the emulated runtime reports as device
** properties. (kernels/emu/grid.h includes only these: EMK_DEVICE_LIMITS_ONLY.) */
#ifndef EMBER_KERNELS_DEVICE_LIMITS
#define EMBER_KERNELS_DEVICE_LIMITS
#define EMK_WARP_SIZE 32
#define EMK_MAX_BLOCK_THREADS 1024
#define EMK_SHARED_MAX (48 * 1024)     /* static + dynamic shared bytes per block */
/* The byte shared memory is filled with at each block start: float 3.4e38,
** double 1.4e306, half NaN, int32 2139062143 -- wrong in sums and maxima. */
#define EMK_SHARED_POISON 0x7F
#endif

#if !defined(EMBER_KERNELS_DEVICE_H) && !defined(EMK_DEVICE_LIMITS_ONLY)
#define EMBER_KERNELS_DEVICE_H
#include "runtime.h"

#define EMK_KERNEL(name, args_type) EMK_KERNEL_IMPL_(name, args_type, 0)
#define EMK_KERNEL_SYNC(name, args_type) EMK_KERNEL_IMPL_(name, args_type, 1)
#define EMK_FULL_MASK 0xffffffffu

#if defined(__CUDACC__)
/* == CUDA C++ (nvcc) ============================================================= */
#define EMK_DEVICE __device__ __forceinline__
#define EMK_HOST_DEVICE __host__ __device__ __forceinline__
#define EMK_RESTRICT __restrict__

/* The __global__ function has C linkage, so its name in the fatbin is exactly
** "k_xxx_emk_dev": the real runtime (kernels/real/launch_real.c) knows a kernel
** only by its descriptor's name and looks that symbol up in the embedded
** fatbins (a static one would get a mangled, module-private name). Kernel names
** are therefore unique across kernels/k_*.cu. The descriptor comes from the
** host build; the fatbin holds device code only. */
#define EMK_KERNEL_IMPL_(name, args_type, sync)                                    \
  extern "C" __global__ void name##_emk_dev(const args_type a)

#define EMK_SYNCTHREADS() __syncthreads()
#define EMK_SYNCWARP(mask) __syncwarp(mask)

#define EMK_SHARED(type, name, count) __shared__ type name[count]
#define EMK_SHARED_2D(type, name, rows, cols) __shared__ type name[rows][cols]
/* Every unsized extern __shared__ array starts at the dynamic shared memory; a
** byte array per name avoids clashing declarations of different types. */
#define EMK_DYN_SHARED(type, name)                                                 \
  extern __shared__ __align__(16) unsigned char name##_emk_dyn[];                  \
  type *const name = reinterpret_cast<type *>(name##_emk_dyn)

template <typename T>
__device__ __forceinline__ T emk_shfl_down_sync(unsigned m, T v, unsigned d) {
  return __shfl_down_sync(m, v, d, 32);
}
template <typename T>
__device__ __forceinline__ T emk_shfl_up_sync(unsigned m, T v, unsigned d) {
  return __shfl_up_sync(m, v, d, 32);
}
template <typename T>
__device__ __forceinline__ T emk_shfl_xor_sync(unsigned m, T v, int lm) {
  return __shfl_xor_sync(m, v, lm, 32);
}
template <typename T>
__device__ __forceinline__ T emk_shfl_sync(unsigned m, T v, int lane) {
  return __shfl_sync(m, v, lane, 32);
}
template <typename T>
__device__ __forceinline__ T emk_shfl_down_sync_w(unsigned m, T v, unsigned d, int w) {
  return __shfl_down_sync(m, v, d, w);
}
template <typename T>
__device__ __forceinline__ T emk_shfl_up_sync_w(unsigned m, T v, unsigned d, int w) {
  return __shfl_up_sync(m, v, d, w);
}
template <typename T>
__device__ __forceinline__ T emk_shfl_xor_sync_w(unsigned m, T v, int lm, int w) {
  return __shfl_xor_sync(m, v, lm, w);
}
template <typename T>
__device__ __forceinline__ T emk_shfl_sync_w(unsigned m, T v, int lane, int w) {
  return __shfl_sync(m, v, lane, w);
}
__device__ __forceinline__ unsigned emk_ballot_sync(unsigned m, int p) {
  return __ballot_sync(m, p);
}
__device__ __forceinline__ int emk_any_sync(unsigned m, int p) { return __any_sync(m, p); }
__device__ __forceinline__ int emk_all_sync(unsigned m, int p) { return __all_sync(m, p); }

__device__ __forceinline__ float emk_atomic_add_f32(float *p, float v) {
  return atomicAdd(p, v);
}
__device__ __forceinline__ double emk_atomic_add_f64(double *p, double v) {
  return atomicAdd(p, v);   /* native from sm_60 */
}
__device__ __forceinline__ int emk_atomic_add_i32(int *p, int v) { return atomicAdd(p, v); }
__device__ __forceinline__ unsigned emk_atomic_add_u32(unsigned *p, unsigned v) {
  return atomicAdd(p, v);
}
__device__ __forceinline__ int64_t emk_atomic_add_i64(int64_t *p, int64_t v) {
  /* two's complement: an unsigned add is the signed add */
  return (int64_t)atomicAdd(reinterpret_cast<unsigned long long *>(p),
                            (unsigned long long)v);
}
__device__ __forceinline__ int emk_atomic_max_i32(int *p, int v) { return atomicMax(p, v); }
__device__ __forceinline__ int emk_atomic_min_i32(int *p, int v) { return atomicMin(p, v); }
__device__ __forceinline__ int emk_atomic_cas_i32(int *p, int cmp, int v) {
  return atomicCAS(p, cmp, v);
}
__device__ __forceinline__ int64_t emk_atomic_cas_i64(int64_t *p, int64_t cmp, int64_t v) {
  return (int64_t)atomicCAS(reinterpret_cast<unsigned long long *>(p),
                            (unsigned long long)cmp, (unsigned long long)v);
}

#else
/* == Host C++ (a .cu) or C, for the grid emulator ================================ */
#include <stdint.h>
#include <string.h>

#define EMK_DEVICE static inline
#define EMK_HOST_DEVICE static inline
#define EMK_RESTRICT __restrict__

#ifdef __cplusplus
extern "C" {
#endif
/* The current emulated thread's indices: set by the emulator on the OS thread
** that runs the launch before each switch into a CUDA thread. */
extern __thread emk_dim3 emk__thread_idx, emk__block_idx, emk__block_dim, emk__grid_dim;
#define threadIdx emk__thread_idx
#define blockIdx emk__block_idx
#define blockDim emk__block_dim
#define gridDim emk__grid_dim
#define warpSize EMK_WARP_SIZE

/* The emulator's entries (grid.c). Called outside a launch they do nothing. */
void emk__syncthreads(void);
/* A warp rendezvous of kind op over the lanes in mask: deposits v (size bytes)
** with a per-lane parameter (delta, lane mask, source lane or predicate) and
** returns what the op gives this lane. */
enum { EMK__SHFL_IDX, EMK__SHFL_UP, EMK__SHFL_DOWN, EMK__SHFL_XOR, EMK__BALLOT,
       EMK__ANY, EMK__ALL, EMK__SYNCWARP };
uint64_t emk__warp_op(int op, unsigned mask, uint64_t v, int size, int param, int width);
/* The block's storage for one EMK_SHARED declaration (site: its address). */
void *emk__shared_static(const void *site, size_t bytes, size_t align);
void *emk__shared_dynamic(void);
#ifdef __cplusplus
}
#endif

/* The descriptor's linkage: a .cu's (C++) is the C launchers' (EMK_KERNEL_DECL),
** a C file's stays in the file. */
#ifdef __cplusplus
#define EMK__DESC_LINKAGE extern "C" __attribute__((visibility("hidden")))
#else
#define EMK__DESC_LINKAGE static
#endif
#define EMK_KERNEL_IMPL_(name, args_type, sync)                                    \
  static void name##_emk_body(const args_type a);                                 \
  static void name##_emk_host(const void *p) {                                    \
    name##_emk_body(*(const args_type *)p);                                       \
  }                                                                                \
  EMK__DESC_LINKAGE const emk_kernel name __attribute__((unused)) = {             \
      #name, name##_emk_host, NULL, sync};                                         \
  static void name##_emk_body(const args_type a)

#define EMK_SYNCTHREADS() emk__syncthreads()
#define EMK_SYNCWARP(mask) ((void)emk__warp_op(EMK__SYNCWARP, (mask), 0, 0, 0, 32))

#define EMK_SHARED(type, name, count)                                              \
  static const char name##_emk_site = 0;                                           \
  type *const name = (type *)emk__shared_static(&name##_emk_site,                  \
                                                sizeof(type) * (size_t)(count),     \
                                                __alignof__(type))
#define EMK_SHARED_2D(type, name, rows, cols)                                      \
  static const char name##_emk_site = 0;                                           \
  type(*const name)[cols] = (type(*)[cols])emk__shared_static(                     \
      &name##_emk_site, sizeof(type) * (size_t)(rows) * (size_t)(cols), __alignof__(type))
#define EMK_DYN_SHARED(type, name) type *const name = (type *)emk__shared_dynamic()

/* -- Warp operations: one function per op and type, picked by _Generic ---------- */
#define EMK__SHFL_FN(opname, OP, sfx, T)                                           \
  static inline T emk__shfl_##opname##_##sfx(unsigned m, T v, int p, int w) {     \
    uint64_t b = 0;                                                                \
    memcpy(&b, &v, sizeof v);                                                      \
    b = emk__warp_op(OP, m, b, (int)sizeof v, p, w);                               \
    memcpy(&v, &b, sizeof v);                                                      \
    return v;                                                                      \
  }
#define EMK__SHFL_TYPES(opname, OP)                                                \
  EMK__SHFL_FN(opname, OP, f, float)                                               \
  EMK__SHFL_FN(opname, OP, d, double)                                              \
  EMK__SHFL_FN(opname, OP, i, int)                                                 \
  EMK__SHFL_FN(opname, OP, u, unsigned)                                            \
  EMK__SHFL_FN(opname, OP, l, long)                                                \
  EMK__SHFL_FN(opname, OP, ul, unsigned long)                                      \
  EMK__SHFL_FN(opname, OP, ll, long long)                                          \
  EMK__SHFL_FN(opname, OP, ull, unsigned long long)
EMK__SHFL_TYPES(idx, EMK__SHFL_IDX)
EMK__SHFL_TYPES(up, EMK__SHFL_UP)
EMK__SHFL_TYPES(down, EMK__SHFL_DOWN)
EMK__SHFL_TYPES(xor, EMK__SHFL_XOR)

#ifndef __cplusplus
#define EMK__SHFL_PICK(opname, v)                                                  \
  _Generic((v), float: emk__shfl_##opname##_f, double: emk__shfl_##opname##_d,     \
           int: emk__shfl_##opname##_i, unsigned: emk__shfl_##opname##_u,          \
           long: emk__shfl_##opname##_l, unsigned long: emk__shfl_##opname##_ul,   \
           long long: emk__shfl_##opname##_ll,                                     \
           unsigned long long: emk__shfl_##opname##_ull)
#define emk_shfl_sync_w(m, v, lane, w) EMK__SHFL_PICK(idx, v)((m), (v), (int)(lane), (w))
#define emk_shfl_up_sync_w(m, v, d, w) EMK__SHFL_PICK(up, v)((m), (v), (int)(d), (w))
#define emk_shfl_down_sync_w(m, v, d, w) EMK__SHFL_PICK(down, v)((m), (v), (int)(d), (w))
#define emk_shfl_xor_sync_w(m, v, lm, w) EMK__SHFL_PICK(xor, v)((m), (v), (int)(lm), (w))
#else /* host C++: overloads instead of _Generic */
#define EMK__SHFL_OVL(opname, sfx, T)                                              \
  static inline T emk__shfl_##opname(unsigned m, T v, int p, int w) {             \
    return emk__shfl_##opname##_##sfx(m, v, p, w);                                 \
  }
#define EMK__SHFL_OVLS(opname)                                                     \
  EMK__SHFL_OVL(opname, f, float) EMK__SHFL_OVL(opname, d, double)                 \
  EMK__SHFL_OVL(opname, i, int) EMK__SHFL_OVL(opname, u, unsigned)                 \
  EMK__SHFL_OVL(opname, l, long) EMK__SHFL_OVL(opname, ul, unsigned long)          \
  EMK__SHFL_OVL(opname, ll, long long) EMK__SHFL_OVL(opname, ull, unsigned long long)
EMK__SHFL_OVLS(idx)
EMK__SHFL_OVLS(up)
EMK__SHFL_OVLS(down)
EMK__SHFL_OVLS(xor)
#define emk_shfl_sync_w(m, v, lane, w) emk__shfl_idx((m), (v), (int)(lane), (w))
#define emk_shfl_up_sync_w(m, v, d, w) emk__shfl_up((m), (v), (int)(d), (w))
#define emk_shfl_down_sync_w(m, v, d, w) emk__shfl_down((m), (v), (int)(d), (w))
#define emk_shfl_xor_sync_w(m, v, lm, w) emk__shfl_xor((m), (v), (int)(lm), (w))
#endif
#define emk_shfl_sync(m, v, lane) emk_shfl_sync_w(m, v, lane, EMK_WARP_SIZE)
#define emk_shfl_up_sync(m, v, d) emk_shfl_up_sync_w(m, v, d, EMK_WARP_SIZE)
#define emk_shfl_down_sync(m, v, d) emk_shfl_down_sync_w(m, v, d, EMK_WARP_SIZE)
#define emk_shfl_xor_sync(m, v, lm) emk_shfl_xor_sync_w(m, v, lm, EMK_WARP_SIZE)

static inline unsigned emk_ballot_sync(unsigned m, int p) {
  return (unsigned)emk__warp_op(EMK__BALLOT, m, 0, 0, p != 0, 32);
}
static inline int emk_any_sync(unsigned m, int p) {
  return (int)emk__warp_op(EMK__ANY, m, 0, 0, p != 0, 32);
}
static inline int emk_all_sync(unsigned m, int p) {
  return (int)emk__warp_op(EMK__ALL, m, 0, 0, p != 0, 32);
}

/* -- Atomics: real ones (relaxed, as CUDA's), since two streams' kernels may run
** at once on two OS threads. Floats go through a compare-and-swap of their bits. */
static inline float emk_atomic_add_f32(float *p, float v) {
  float old, nv;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do nv = old + v;
  while (!__atomic_compare_exchange(p, &old, &nv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
static inline double emk_atomic_add_f64(double *p, double v) {
  double old, nv;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do nv = old + v;
  while (!__atomic_compare_exchange(p, &old, &nv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
static inline int emk_atomic_add_i32(int *p, int v) {
  /* wraps like the GPU's (an unsigned add: no signed-overflow UB) */
  return (int)__atomic_fetch_add((unsigned *)p, (unsigned)v, __ATOMIC_RELAXED);
}
static inline unsigned emk_atomic_add_u32(unsigned *p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline int64_t emk_atomic_add_i64(int64_t *p, int64_t v) {
  return (int64_t)__atomic_fetch_add((uint64_t *)p, (uint64_t)v, __ATOMIC_RELAXED);
}
static inline int emk_atomic_max_i32(int *p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
static inline int emk_atomic_min_i32(int *p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old > v &&
         !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
static inline int emk_atomic_cas_i32(int *p, int cmp, int v) {
  __atomic_compare_exchange_n(p, &cmp, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return cmp;   /* the old value either way */
}
static inline int64_t emk_atomic_cas_i64(int64_t *p, int64_t cmp, int64_t v) {
  __atomic_compare_exchange_n(p, &cmp, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return cmp;
}
#endif /* __CUDACC__ */

/* Four floats loaded or stored as one 16-byte access (CUDA's float4; the
** pointer must be 16-byte aligned): for vectorised paths. */
#if defined(__CUDACC__)
typedef float4 emk_float4;
#else
typedef struct __attribute__((aligned(16))) emk_float4 { float x, y, z, w; } emk_float4;
#endif
#endif /* EMBER_KERNELS_DEVICE_H */
