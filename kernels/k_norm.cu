/*
** k_norm.cu -- the CUDA backend's layer norm, forward and backward. The device
** code, one source for nvcc and the grid emulator (device.h); the launchers are
** k_norm.c. Semantics follow the CPU backend's core/cpu/normalize.c: x is M rows of
** K; per row the mean and the sum of squared deviations are summed in double (two
** passes, so float32 rows with a large mean keep their variance), rstd = 1/sqrt(var
** + eps); the element-wise parts run in x's dtype with the CPU's expressions.
**
** Rows. One row per warp (K <= ROW_WARP_MAX) or per block of 256 threads
** (longer rows), chosen by the shape alone. The row's threads take elements
** k = lane, lane + tpr, ... in order; partials are combined by a warp-shuffle
** butterfly (every lane holds the same bits) and, for a block, the 8 warp sums
** added in warp order from shared memory. The backward's gx needs two row sums,
** sum(g*w) and sum(g*w*xhat), then one element-wise pass.
**
** gw, gb are sums over rows. Instead of atomics (whose order varies run to
** run) the rows are cut into CH chunks, CH fixed by M: k_ln_wb_part gives each
** (chunk, column) one thread that adds its chunk's rows in order into a double
** scratch (CH, 2, K); k_ln_wb_fin adds a column's CH partials in chunk order.
** Threads of a warp take adjacent columns, so both passes read coalesced rows.
** M = 0 gives CH = 0 and zeros, as the CPU.
*/
#include "k_norm_args.h"
#include "device.h"
#include "dtype_dev.h"

/* -- Device helpers ------------------------------------------------------------------ */

/* v summed over the tpr threads of a row (32: a warp; 256: the block) in a fixed
** order; every thread of the row gets the same bits. Only tpr == THREADS reaches
** the barriers, and then the whole block works on one row. sh: THREADS/32. */
EMK_DEVICE double row_sum(double v, double *sh, int tpr) {
  for (int o = 16; o > 0; o >>= 1) v += emk_shfl_xor_sync(EMK_FULL_MASK, v, o);
  if (tpr == 32) return v;
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  EMK_SYNCTHREADS();
  v = sh[0];
  for (int w = 1; w < tpr / 32; w++) v += sh[w];
  EMK_SYNCTHREADS();             /* sh is reused by the next call */
  return v;
}

EMK_DEVICE double ldx(const char *p, int64_t i, int f64) {
  return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* -- Forward ------------------------------------------------------------------------- */

/* x, y (M, K); mean, rstd (M). One row per tpr threads. */
EMK_KERNEL_SYNC(k_ln_fwd, ln_args) {
  EMK_SHARED(double, sh, THREADS / 32);
  int rpb = THREADS / a.tpr, lane = (int)threadIdx.x % a.tpr;
  for (int64_t i = (int64_t)blockIdx.x * rpb + (int)threadIdx.x / a.tpr; i < a.M;
       i += (int64_t)gridDim.x * rpb) {
    int64_t o = i * a.K;
    double s = 0, q = 0;
    for (int64_t k = lane; k < a.K; k += a.tpr) s += ldx(a.x, o + k, a.f64);
    double m = row_sum(s, sh, a.tpr) / (double)a.K;
    for (int64_t k = lane; k < a.K; k += a.tpr) {
      double d = ldx(a.x, o + k, a.f64) - m;
      q += d * d;
    }
    double rs = 1 / sqrt(row_sum(q, sh, a.tpr) / (double)a.K + a.eps);
    /* y in x's dtype from the rounded statistics, as the CPU */
    if (a.f64) {
      const double *x = (const double *)a.x + o, *w = (const double *)a.w,
                   *b = (const double *)a.b;
      double *y = (double *)a.y + o;
      for (int64_t k = lane; k < a.K; k += a.tpr) {
        double v = (x[k] - m) * rs;
        y[k] = v * (w ? w[k] : 1) + (b ? b[k] : 0);
      }
      if (lane == 0) { ((double *)a.mo)[i] = m; ((double *)a.ro)[i] = rs; }
    } else {
      const float *x = (const float *)a.x + o, *w = (const float *)a.w,
                  *b = (const float *)a.b;
      float *y = (float *)a.y + o, fm = (float)m, fr = (float)rs;
      for (int64_t k = lane; k < a.K; k += a.tpr) {
        float v = (x[k] - fm) * fr;
        y[k] = v * (w ? w[k] : 1.0f) + (b ? b[k] : 0.0f);
      }
      if (lane == 0) { ((float *)a.mo)[i] = fm; ((float *)a.ro)[i] = fr; }
    }
  }
}

/* -- Backward ------------------------------------------------------------------------ */

/* Row i of gx (M, K), at offset o, by the row's thread `lane`: rs * (g*w -
** mean(g*w) - xhat * mean(g*w*xhat)), in x's dtype T with the two row sums in
** double (as the CPU's ln_bwd_x). */
template <typename T>
EMK_DEVICE void ln_bwd_row(const ln_args *a, double *sh, int64_t i, int64_t o, int lane) {
  const T *x = (const T *)a->x + o, *g = (const T *)a->gy + o, *w = (const T *)a->w;
  T m = ((const T *)a->mean)[i], rs = ((const T *)a->rstd)[i];
  T *gx = (T *)a->gx + o;
  double sa = 0, sb = 0;
  for (int64_t k = lane; k < a->K; k += a->tpr) {
    T gw = g[k] * (w ? w[k] : (T)1);
    sa += gw;
    sb += gw * (x[k] - m) * rs;
  }
  sa = row_sum(sa, sh, a->tpr);
  sb = row_sum(sb, sh, a->tpr);
  T ma = (T)(sa / (double)a->K), mb = (T)(sb / (double)a->K);
  for (int64_t k = lane; k < a->K; k += a->tpr)
    gx[k] = rs * (g[k] * (w ? w[k] : (T)1) - ma - (x[k] - m) * rs * mb);
}

EMK_KERNEL_SYNC(k_ln_bwd_x, ln_args) {
  EMK_SHARED(double, sh, THREADS / 32);
  int rpb = THREADS / a.tpr, lane = (int)threadIdx.x % a.tpr;
  for (int64_t i = (int64_t)blockIdx.x * rpb + (int)threadIdx.x / a.tpr; i < a.M;
       i += (int64_t)gridDim.x * rpb) {
    int64_t o = i * a.K;
    if (a.f64) ln_bwd_row<double>(&a, sh, i, o, lane);
    else ln_bwd_row<float>(&a, sh, i, o, lane);
  }
}

/* part[c][0][k] = sum of g*xhat, part[c][1][k] = sum of g over chunk c's rows, in
** row order; one thread per (chunk, column). */
EMK_KERNEL(k_ln_wb_part, ln_args) {
  int64_t n = a.ch * a.K, step = (int64_t)gridDim.x * blockDim.x;
  int64_t per = (a.M + a.ch - 1) / a.ch;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) {
    int64_t c = e / a.K, k = e - c * a.K, i1 = (c + 1) * per;
    double sw = 0, sb = 0;
    if (i1 > a.M) i1 = a.M;
    for (int64_t i = c * per; i < i1; i++) {
      if (a.f64) {
        double g = ((const double *)a.gy)[i * a.K + k];
        sw += g * (((const double *)a.x)[i * a.K + k] - ((const double *)a.mean)[i]) *
              ((const double *)a.rstd)[i];
        sb += g;
      } else {
        float g = ((const float *)a.gy)[i * a.K + k];
        sw += g * (((const float *)a.x)[i * a.K + k] - ((const float *)a.mean)[i]) *
              ((const float *)a.rstd)[i];
        sb += g;
      }
    }
    a.part[(c * 2) * a.K + k] = sw;
    a.part[(c * 2 + 1) * a.K + k] = sb;
  }
}

/* gw[k], gb[k] (either may be NULL): column k's ch partials in chunk order */
EMK_KERNEL(k_ln_wb_fin, ln_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < a.K; k += step) {
    double sw = 0, sb = 0;
    for (int64_t c = 0; c < a.ch; c++) {
      sw += a.part[(c * 2) * a.K + k];
      sb += a.part[(c * 2 + 1) * a.K + k];
    }
    if (a.f64) {
      if (a.gw) ((double *)a.gw)[k] = sw;
      if (a.gb) ((double *)a.gb)[k] = sb;
    } else {
      if (a.gw) ((float *)a.gw)[k] = (float)sw;
      if (a.gb) ((float *)a.gb)[k] = (float)sb;
    }
  }
}
