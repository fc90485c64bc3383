/*
** rnn_cell.c -- the pointwise part of one LSTM step on the CPU, fused: one pass
** over a step's gates where composed ops take a dozen (two activations, the
** cell's products and sums, their gradients), each a trip through memory and an
** op's dispatch. nn.LSTM's time loop (lua/ember/nn/rnn_recurrence.lua) calls it
** on contiguous host buffers between its recurrent matmuls; other devices
** compose the same arithmetic from ops.
**
** Forward: gates (N, 4H) hold the pre-activations in PyTorch's order i, f, g, o,
** plus gates2's where it is given (the step's recurrent product and its input's
** projection, added here rather than by a pass of their own); i, f, o = sigmoid,
** g = tanh; c = f c_prev + i g; h = o tanh(c). act (N, 4H), which may be gates
** itself, receives the activations the backward reads.
**
** Backward, from dh and dc (the gradients of h and of c) and tc = tanh(c):
** dc' = dc + dh o (1 - tc^2); the gates' gradients before their activations are
** di = dc' g i (1 - i), df = dc' c_prev f (1 - f), dg = dc' i (1 - g^2) and
** do = dh tc o (1 - o); c_prev's gradient is dc' f, written over dc. tanh(c) is
** computed again rather than kept: a pass of arithmetic costs less than a
** (N, H) tensor per step held through the forward.
**
** The float32 activations are vmath.h's, as unary.c's sigmoid and tanh, so the
** fused step and the composed one agree to the rounding of the cell's sums.
*/
#include "internal.h"
#include "vmath.h"
#include <math.h>
#include <string.h>

typedef struct cell_job {
  int64_t H;
  const void *gates, *gates2, *c_prev, *c, *dh, *dh2;
  void *act, *h, *c_out, *dc, *dgates;
} cell_job;

static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + emi_vexpf(-x)); }
static inline double sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline float tanh_f32(float x) { return emi_vtanhf(x); }
static inline double tanh_f64(double x) { return tanh(x); }

/* Rows [r0, r1) of the forward and of the backward, for T = float and double. The
** forward copies a block of a row's pre-activations (gates, plus gates2) into
** local arrays, computes there and copies the results out, so that act may be
** gates itself and every loop still vectorizes. */
enum { BLOCK = 64 };
#define CELL_LOOPS(T, SFX)                                                                   \
  static void forward_##SFX(void *ctx, int64_t r0, int64_t r1) {                            \
    const cell_job *j = ctx;                                                                 \
    int64_t H = j->H;                                                                        \
    T ai[BLOCK], af[BLOCK], ag[BLOCK], ao[BLOCK], ac[BLOCK], ah[BLOCK], pre[4][BLOCK];       \
    size_t w = sizeof(T);                                                                    \
    for (int64_t r = r0; r < r1; r++) {                                                      \
      const T *x = (const T *)j->gates + r * 4 * H, *cp = (const T *)j->c_prev + r * H;     \
      const T *x2 = j->gates2 ? (const T *)j->gates2 + r * 4 * H : NULL;                     \
      T *a = (T *)j->act + r * 4 * H, *h = (T *)j->h + r * H, *c = (T *)j->c_out + r * H;   \
      for (int64_t k0 = 0; k0 < H; k0 += BLOCK) {                                            \
        int64_t n = H - k0 < BLOCK ? H - k0 : BLOCK;                                         \
        for (int q = 0; q < 4; q++) memcpy(pre[q], x + q * H + k0, w * n);                   \
        if (x2)                                                                              \
          for (int q = 0; q < 4; q++)                                                        \
            for (int64_t k = 0; k < n; k++) pre[q][k] += x2[q * H + k0 + k];                 \
        for (int64_t k = 0; k < n; k++) {                                                    \
          T i = sigmoid_##SFX(pre[0][k]), f = sigmoid_##SFX(pre[1][k]);                      \
          T g = tanh_##SFX(pre[2][k]), o = sigmoid_##SFX(pre[3][k]);                         \
          T cn = f * cp[k0 + k] + i * g;                                                     \
          ai[k] = i; af[k] = f; ag[k] = g; ao[k] = o; ac[k] = cn;                            \
          ah[k] = o * tanh_##SFX(cn);                                                        \
        }                                                                                    \
        memcpy(a + k0, ai, w * n); memcpy(a + H + k0, af, w * n);                            \
        memcpy(a + 2 * H + k0, ag, w * n); memcpy(a + 3 * H + k0, ao, w * n);                \
        memcpy(c + k0, ac, w * n); memcpy(h + k0, ah, w * n);                                \
      }                                                                                      \
    }                                                                                        \
  }                                                                                          \
  static void backward_##SFX(void *ctx, int64_t r0, int64_t r1) {                           \
    const cell_job *j = ctx;                                                                 \
    int64_t H = j->H;                                                                        \
    T y[BLOCK], di[BLOCK], df[BLOCK], dg[BLOCK], dO[BLOCK], dcp[BLOCK];                     \
    size_t w = sizeof(T);                                                                    \
    for (int64_t r = r0; r < r1; r++) {                                                      \
      const T *a = (const T *)j->act + r * 4 * H, *c = (const T *)j->c + r * H;             \
      const T *cp = (const T *)j->c_prev + r * H, *dh = (const T *)j->dh + r * H;           \
      const T *dh2 = j->dh2 ? (const T *)j->dh2 + r * H : NULL;                              \
      T *dc = (T *)j->dc + r * H, *dx = (T *)j->dgates + r * 4 * H;                          \
      for (int64_t k0 = 0; k0 < H; k0 += BLOCK) {                                            \
        int64_t n = H - k0 < BLOCK ? H - k0 : BLOCK;                                         \
        memcpy(y, dh + k0, w * n);                                                           \
        if (dh2)                                                                             \
          for (int64_t k = 0; k < n; k++) y[k] += dh2[k0 + k];                               \
        for (int64_t k = 0; k < n; k++) {                                                    \
          T i = a[k0 + k], f = a[H + k0 + k], g = a[2 * H + k0 + k], o = a[3 * H + k0 + k];  \
          T tc = tanh_##SFX(c[k0 + k]);                                                      \
          T d = dc[k0 + k] + y[k] * o * (1 - tc * tc);                                       \
          di[k] = d * g * i * (1 - i);                                                       \
          df[k] = d * cp[k0 + k] * f * (1 - f);                                              \
          dg[k] = d * i * (1 - g * g);                                                       \
          dO[k] = y[k] * tc * o * (1 - o);                                                   \
          dcp[k] = d * f;                                                                    \
        }                                                                                    \
        memcpy(dx + k0, di, w * n); memcpy(dx + H + k0, df, w * n);                          \
        memcpy(dx + 2 * H + k0, dg, w * n); memcpy(dx + 3 * H + k0, dO, w * n);              \
        memcpy(dc + k0, dcp, w * n);                                                         \
      }                                                                                      \
    }                                                                                        \
  }

CELL_LOOPS(float, f32)
CELL_LOOPS(double, f64)

static em_status cell_check(em_state *S, const char *op, em_dtype dt, int64_t N, int64_t H) {
  if (N < 0 || H < 1)
    return emi_error(S, EM_ERR_ARG, "%s: bad sizes N = %lld, H = %lld (N >= 0, H >= 1)", op,
                     (long long)N, (long long)H);
  if (dt != EM_FLOAT32 && dt != EM_FLOAT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: expected float32 or float64, got %s", op,
                     em_dtype_name(dt));
  return EM_OK;
}

/* Rows per chunk: a thread's share is worth its wake-up from about 16K elements. */
static void run_rows(em_state *S, int64_t N, int64_t H, emi_range_fn fn, cell_job *j) {
  int64_t grain = 16384 / (4 * H);
  if (grain < 1) grain = 1;
  if (N <= grain) fn(j, 0, N);
  else emi_parallel_for(S, N, grain, fn, j);
}

em_status em_cpu_lstm_cell_forward(em_state *S, em_dtype dt, int64_t N, int64_t H,
                                   const void *gates, const void *gates2, const void *c_prev,
                                   void *act, void *h, void *c) {
  em_status st = cell_check(S, "lstm_cell_forward (cpu kernel)", dt, N, H);
  if (st) return st;
  if (!gates || !c_prev || !act || !h || !c)
    return em_set_error(S, EM_ERR_ARG, "lstm_cell_forward (cpu kernel): NULL buffer");
  cell_job j = {.H = H, .gates = gates, .gates2 = gates2, .c_prev = c_prev, .act = act, .h = h,
                .c_out = c};
  run_rows(S, N, H, dt == EM_FLOAT32 ? forward_f32 : forward_f64, &j);
  return EM_OK;
}

em_status em_cpu_lstm_cell_backward(em_state *S, em_dtype dt, int64_t N, int64_t H,
                                    const void *act, const void *c, const void *c_prev,
                                    const void *dh, const void *dh2, void *dc,
                                    void *dgates) {
  em_status st = cell_check(S, "lstm_cell_backward (cpu kernel)", dt, N, H);
  if (st) return st;
  if (!act || !c || !c_prev || !dh || !dc || !dgates)
    return em_set_error(S, EM_ERR_ARG, "lstm_cell_backward (cpu kernel): NULL buffer");
  cell_job j = {.H = H, .act = (void *)act, .c = c, .c_prev = c_prev, .dh = dh, .dh2 = dh2,
                .dc = dc, .dgates = dgates};
  run_rows(S, N, H, dt == EM_FLOAT32 ? backward_f32 : backward_f64, &j);
  return EM_OK;
}
