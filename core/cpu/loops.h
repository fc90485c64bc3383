/*
** loops.h -- the machinery shared by the CPU element-wise kernels (copy.c,
** unary.c, binary.c, elementwise.c).
**
** A kernel is a table of 1-D "loops" indexed by [op][dtype]. A loop processes n
** elements whose addresses advance by byte strides (so, sa, sb, ...); each loop
** has a branch for the contiguous case written so that the compiler vectorizes
** it, and a strided fallback. emi_cpu_foreach walks out-shaped operands as rows
** (coalesced by emi_iter, or one flat row when all are contiguous) and splits
** the work over the state's workers when it is large.
**
** float16 and bfloat16 have no loops of their own: the adapters below widen a
** chunk of each operand into float buffers, run the float32 loop on them and
** narrow the result back.
*/
#ifndef EMBER_CPU_LOOPS_H
#define EMBER_CPU_LOOPS_H
#include "cpu.h"

/* Extra arguments a loop may need (scalars, bounds, an error flag). */
typedef struct emi_kparams {
  double d0, d1;          /* alpha / clamp bounds / a scalar, as double */
  float f0, f1;           /* the same as float (for float32/half loops) */
  int64_t i0, i1;         /* the same as int64 (for integer loops) */
  int err;                /* set (atomically) by a loop that hit an error */
} emi_kparams;

typedef void (*emi_loop1)(char *o, const char *a, int64_t n, int64_t so, int64_t sa,
                          emi_kparams *p);
typedef void (*emi_loop2)(char *o, const char *a, const char *b, int64_t n, int64_t so,
                          int64_t sa, int64_t sb, emi_kparams *p);

/* fn(ctx, ptrs, strides, n): one row of n elements; ptrs/strides per operand. */
typedef void (*emi_row_fn)(void *ctx, char *const *p, const int64_t *s, int64_t n);

/* Run fn over every element of ops[0..nops) (out-shaped; ops[0] is the output).
** Work above `grain` elements is split over the state's threads. */
void emi_cpu_foreach(em_state *S, em_tensor *const *ops, int nops, int64_t grain,
                     emi_row_fn fn, void *ctx);

/* Grain sizes: cheap ops only go parallel on large tensors; transcendental ones
** pay for a thread hand-off much sooner. */
enum { EMI_GRAIN_CHEAP = 32768, EMI_GRAIN_COSTLY = 4096 };

/* Chunk of the half adapters (elements per float buffer). */
enum { EMI_HALF_CHUNK = 256 };

/* Half adapters. dt is EM_FLOAT16 or EM_BFLOAT16. a_f32 / b_f32: that operand is
** already a float (a scalar, stride 0). out_bool: the float loop writes bool. */
void emi_half_loop1(emi_loop1 f32, em_dtype dt, int out_bool, char *o, const char *a,
                    int64_t n, int64_t so, int64_t sa, emi_kparams *p);
void emi_half_loop2(emi_loop2 f32, em_dtype dt, int out_bool, char *o, const char *a,
                    const char *b, int64_t n, int64_t so, int64_t sa, int64_t sb,
                    int a_f32, int b_f32, emi_kparams *p);

/* n float16/bfloat16 values at byte stride s <-> n contiguous floats (vector
** conversions where the CPU has them). */
void emi_half_to_float_n(float *dst, const char *src, int64_t n, int64_t s, em_dtype dt);
void emi_float_to_half_n(char *dst, const float *src, int64_t n, int64_t s, em_dtype dt);

/* float <-> double -> int64 with the clamping of emi_store_f64 (no UB on NaN or
** out-of-range values). */
static inline int64_t emi_f2i(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

/* The table entry of a unary op (NULL when the dtype is not supported); the
** scalar pow kernel reuses square/sqrt/reciprocal/rsqrt for special exponents. */
emi_loop1 emi_cpu_unary_loop(em_unop op, em_dtype dt);

#endif
