/*
** attention.c -- the fused CPU scaled-dot-product attention behind
** em.nn.F.scaled_dot_product_attention: one pass over the keys per block of
** queries with an online (running max) softmax, so no L x S matrix is ever kept;
** the backward recomputes each block's scores from the saved row log-sum-exps
** (the FlashAttention scheme): in one pass per batch entry where there are entries
** enough for the threads, else in two (dK and dV per key block, then dQ per query
** block) so that a single long sequence still spreads over them. float32 runs on ember's GEMM (nn_gemm.c), float64
** on a plain loop (it serves gradcheck), bfloat16 widens to float32, computes
** there and rounds the results back. The Lua layer hands contiguous buffers.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nn.h"
#include "vmath.h"

enum { QB = 64, KB = 64 };   /* query and key rows per block */

/* C (MxN) = [C +] A (MxK, strides ars/acs) * B (KxN, row stride ldb), in double. */
static void att_dgemm(int64_t M, int64_t N, int64_t K, const double *A, int64_t ars,
                      int64_t acs, const double *B, int64_t ldb, double *C, int64_t ldc,
                      int acc) {
  for (int64_t i = 0; i < M; i++) {
    double *c = C + i * ldc;
    if (!acc) for (int64_t j = 0; j < N; j++) c[j] = 0;
    for (int64_t p = 0; p < K; p++) {
      double x = A[i * ars + p * acs];
      if (x == 0) continue;
      const double *b = B + p * ldb;
      for (int64_t j = 0; j < N; j++) c[j] += x * b[j];
    }
  }
}

#define T float
#define GEMM emi_nn_sgemm
#define EXP emi_vexpf
#define SFX _f32
#include "attention_impl.h"
#undef T
#undef GEMM
#undef EXP
#undef SFX

#define T double
#define GEMM att_dgemm
#define EXP exp
#define SFX _f64
#include "attention_impl.h"
#undef T
#undef GEMM
#undef EXP
#undef SFX

static em_status att_bad(em_state *S, const char *msg) {
  return em_set_error(S, EM_ERR_ARG, msg);
}

static float *widen_bf16(const uint16_t *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)(n + 1));
  if (y) for (int64_t i = 0; i < n; i++) y[i] = emi_bf16_to_float(x[i]);
  return y;
}

static void narrow_bf16(const float *x, uint16_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = emi_float_to_bf16(x[i]);
}

static em_status att_check(em_state *S, em_dtype dt, int64_t B, int64_t L, int64_t Skv,
                           int64_t E, int64_t Ev) {
  if (B < 0 || L < 0 || Skv < 0 || E < 1 || Ev < 1)
    return att_bad(S, "scaled_dot_product_attention (cpu kernel): bad sizes");
  if (dt != EM_FLOAT32 && dt != EM_FLOAT64 && dt != EM_BFLOAT16)
    return em_set_error(S, EM_ERR_DTYPE, "scaled_dot_product_attention (cpu kernel): "
                        "expected float32, float64 or bfloat16");
  return EM_OK;
}

static em_status att_nomem(em_state *S) {
  return em_set_error(S, EM_ERR_NOMEM, "scaled_dot_product_attention (cpu kernel): out of "
                      "memory for its scratch buffers");
}

em_status em_cpu_attention_forward(em_state *S, em_dtype dt, int64_t B, int64_t L,
                                   int64_t Skv, int64_t E, int64_t Ev, const void *q,
                                   const void *k, const void *v, const void *mask,
                                   const int64_t *mask_strides, int causal, double scale,
                                   void *out, void *lse) {
  em_status st = att_check(S, dt, B, L, Skv, E, Ev);
  if (st != EM_OK) return st;
  if (B * L == 0) return EM_OK;
  if (dt == EM_FLOAT64)
    return att_forward_f64(S, B, L, Skv, E, Ev, q, k, v, mask, mask_strides, causal, scale,
                           out, lse) ? EM_OK : att_nomem(S);
  if (dt == EM_FLOAT32)
    return att_forward_f32(S, B, L, Skv, E, Ev, q, k, v, mask, mask_strides, causal, scale,
                           out, lse) ? EM_OK : att_nomem(S);
  float *fq = widen_bf16(q, B * L * E), *fk = widen_bf16(k, B * Skv * E);
  float *fv = widen_bf16(v, B * Skv * Ev), *fo = malloc(sizeof(float) * (size_t)(B * L * Ev));
  bool ok = fq && fk && fv && fo &&
            att_forward_f32(S, B, L, Skv, E, Ev, fq, fk, fv, mask, mask_strides, causal,
                            scale, fo, lse);
  if (ok) narrow_bf16(fo, out, B * L * Ev);
  free(fq); free(fk); free(fv); free(fo);
  return ok ? EM_OK : att_nomem(S);
}

em_status em_cpu_attention_backward(em_state *S, em_dtype dt, int64_t B, int64_t L,
                                    int64_t Skv, int64_t E, int64_t Ev, const void *q,
                                    const void *k, const void *v, const void *mask,
                                    const int64_t *mask_strides, int causal, double scale,
                                    const void *out, const void *lse, const void *dout,
                                    void *dq, void *dk, void *dv) {
  em_status st = att_check(S, dt, B, L, Skv, E, Ev);
  if (st != EM_OK) return st;
  if (dt == EM_FLOAT64 || dt == EM_FLOAT32) {
    if (B * L == 0 || Skv == 0) {     /* nothing attended: every gradient is zero */
      size_t w = dt == EM_FLOAT64 ? sizeof(double) : sizeof(float);
      memset(dq, 0, w * (size_t)(B * L * E));
      memset(dk, 0, w * (size_t)(B * Skv * E));
      memset(dv, 0, w * (size_t)(B * Skv * Ev));
      return EM_OK;
    }
    bool ok = dt == EM_FLOAT64
      ? att_backward_f64(S, B, L, Skv, E, Ev, q, k, v, mask, mask_strides, causal, scale, out,
                         lse, dout, dq, dk, dv)
      : att_backward_f32(S, B, L, Skv, E, Ev, q, k, v, mask, mask_strides, causal, scale, out,
                         lse, dout, dq, dk, dv);
    return ok ? EM_OK : att_nomem(S);
  }
  if (B * L == 0 || Skv == 0) {
    memset(dq, 0, 2 * (size_t)(B * L * E));
    memset(dk, 0, 2 * (size_t)(B * Skv * E));
    memset(dv, 0, 2 * (size_t)(B * Skv * Ev));
    return EM_OK;
  }
  float *fq = widen_bf16(q, B * L * E), *fk = widen_bf16(k, B * Skv * E);
  float *fv = widen_bf16(v, B * Skv * Ev), *fo = widen_bf16(out, B * L * Ev);
  float *fdo = widen_bf16(dout, B * L * Ev);
  float *g = malloc(sizeof(float) * (size_t)(B * L * E + B * Skv * (E + Ev) + 1));
  bool ok = fq && fk && fv && fo && fdo && g &&
            att_backward_f32(S, B, L, Skv, E, Ev, fq, fk, fv, mask, mask_strides, causal,
                             scale, fo, lse, fdo, g, g + B * L * E, g + B * L * E + B * Skv * E);
  if (ok) {
    narrow_bf16(g, dq, B * L * E);
    narrow_bf16(g + B * L * E, dk, B * Skv * E);
    narrow_bf16(g + B * L * E + B * Skv * E, dv, B * Skv * Ev);
  }
  free(fq); free(fk); free(fv); free(fo); free(fdo); free(g);
  return ok ? EM_OK : att_nomem(S);
}
