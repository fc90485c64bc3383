/*
** reduce.c -- the arithmetic of the collectives: out = in[0] op in[1] op ... op
** in[n-1], always in rank order, so that a sum is the same bits whatever the
** timing of the replicas. float16 and bfloat16 are accumulated in float32 and
** rounded once at the end (what "reduced in float32" means in ember.h), int32 and
** int64 in their own type (wrapping as C's unsigned arithmetic would).
**
** The loops work on chunks of CHUNK elements: an accumulator of CHUNK float32 or
** double lives on the stack, each input streams through it once, and the chunk is
** then written to every output. The inner loops are plain and vectorise.
*/
#include "comm.h"

enum { CHUNK = 2048 };

#define OP_LOOP(ACC, X, N, OP)                                                       \
  do {                                                                               \
    if ((OP) == EM_COMM_SUM || (OP) == EM_COMM_MEAN) {                               \
      for (int64_t i = 0; i < (N); i++) ACC[i] += X[i];                              \
    } else if ((OP) == EM_COMM_MAX) {   /* a NaN anywhere wins, as in torch.max */   \
      for (int64_t i = 0; i < (N); i++) ACC[i] = X[i] > ACC[i] || X[i] != X[i] ? X[i] : ACC[i]; \
    } else {                                                                         \
      for (int64_t i = 0; i < (N); i++) ACC[i] = X[i] < ACC[i] || X[i] != X[i] ? X[i] : ACC[i]; \
    }                                                                                \
  } while (0)

/* float32 accumulation of float32 / float16 / bfloat16 inputs */
static void load_f32(float *dst, const void *src, em_dtype dt, int64_t n) {
  if (dt == EM_FLOAT32) { memcpy(dst, src, (size_t)n * 4); return; }
  const uint16_t *h = src;
  if (dt == EM_FLOAT16) for (int64_t i = 0; i < n; i++) dst[i] = emi_half_to_float(h[i]);
  else for (int64_t i = 0; i < n; i++) dst[i] = emi_bf16_to_float(h[i]);
}

static void store_f32(void *dst, const float *src, em_dtype dt, int64_t n) {
  if (dt == EM_FLOAT32) { memcpy(dst, src, (size_t)n * 4); return; }
  uint16_t *h = dst;
  if (dt == EM_FLOAT16) for (int64_t i = 0; i < n; i++) h[i] = emi_float_to_half(src[i]);
  else for (int64_t i = 0; i < n; i++) h[i] = emi_float_to_bf16(src[i]);
}

static void reduce_f32(em_dtype dt, em_comm_op op, void *const *out, int nout,
                       const void *const *in, int n, int64_t count) {
  size_t es = em_dtype_size(dt);
  float acc[CHUNK], x[CHUNK];
  for (int64_t base = 0; base < count; base += CHUNK) {
    int64_t m = count - base < CHUNK ? count - base : CHUNK;
    load_f32(acc, (const char *)in[0] + base * es, dt, m);
    for (int k = 1; k < n; k++) {
      const float *xs = x;
      if (dt == EM_FLOAT32) xs = (const float *)in[k] + base;
      else load_f32(x, (const char *)in[k] + base * es, dt, m);
      OP_LOOP(acc, xs, m, op);
    }
    if (op == EM_COMM_MEAN) {
      float inv = (float)n;
      for (int64_t i = 0; i < m; i++) acc[i] /= inv;
    }
    for (int k = 0; k < nout; k++) store_f32((char *)out[k] + base * es, acc, dt, m);
  }
}

static void reduce_f64(em_comm_op op, void *const *out, int nout, const void *const *in,
                       int n, int64_t count) {
  double acc[CHUNK];
  for (int64_t base = 0; base < count; base += CHUNK) {
    int64_t m = count - base < CHUNK ? count - base : CHUNK;
    memcpy(acc, (const double *)in[0] + base, (size_t)m * 8);
    for (int k = 1; k < n; k++) {
      const double *xs = (const double *)in[k] + base;
      OP_LOOP(acc, xs, m, op);
    }
    if (op == EM_COMM_MEAN)
      for (int64_t i = 0; i < m; i++) acc[i] /= (double)n;
    for (int k = 0; k < nout; k++) memcpy((double *)out[k] + base, acc, (size_t)m * 8);
  }
}

/* Integers: sums wrap (computed unsigned, as two's complement does). */
#define REDUCE_INT(NAME, T, U)                                                        \
  static void NAME(em_comm_op op, void *const *out, int nout, const void *const *in, \
                   int n, int64_t count) {                                            \
    T acc[CHUNK];                                                                     \
    for (int64_t base = 0; base < count; base += CHUNK) {                             \
      int64_t m = count - base < CHUNK ? count - base : CHUNK;                        \
      memcpy(acc, (const T *)in[0] + base, (size_t)m * sizeof(T));                    \
      for (int k = 1; k < n; k++) {                                                   \
        const T *xs = (const T *)in[k] + base;                                        \
        if (op == EM_COMM_SUM)                                                      \
          for (int64_t i = 0; i < m; i++) acc[i] = (T)((U)acc[i] + (U)xs[i]);         \
        else if (op == EM_COMM_MAX)                                                 \
          for (int64_t i = 0; i < m; i++) acc[i] = xs[i] > acc[i] ? xs[i] : acc[i];   \
        else                                                                          \
          for (int64_t i = 0; i < m; i++) acc[i] = xs[i] < acc[i] ? xs[i] : acc[i];   \
      }                                                                               \
      for (int k = 0; k < nout; k++)                                                  \
        memcpy((T *)out[k] + base, acc, (size_t)m * sizeof(T));                       \
    }                                                                                 \
  }
REDUCE_INT(reduce_i32, int32_t, uint32_t)
REDUCE_INT(reduce_i64, int64_t, uint64_t)

void emi_reduce_buffers_to(em_dtype dt, em_comm_op op, void *const *out, int nout,
                           const void *const *in, int n, int64_t count) {
  switch (dt) {
  case EM_FLOAT32: case EM_FLOAT16: case EM_BFLOAT16:
    reduce_f32(dt, op, out, nout, in, n, count); break;
  case EM_FLOAT64: reduce_f64(op, out, nout, in, n, count); break;
  case EM_INT32: reduce_i32(op, out, nout, in, n, count); break;
  case EM_INT64: reduce_i64(op, out, nout, in, n, count); break;
  default: break;   /* comm.c admits only the dtypes above */
  }
}

void emi_reduce_buffers(em_dtype dt, em_comm_op op, void *out, const void *const *in,
                        int n, int64_t count) {
  void *outs[1] = {out};
  emi_reduce_buffers_to(dt, op, outs, 1, in, n, count);
}
