/*
** k_reduce.cu -- the CUDA backend's reductions: reduce (sum, mean, prod, amax,
** amin, logsumexp, any, all), var/std, p-norms, max/min with indices along a dim
** (arg_reduce) and softmax / log_softmax. The device code, one source for nvcc and
** the grid emulator (device.h); the launchers are k_reduce.c.
**
** Geometry. The input is seen as K outputs of R reduced elements each: kept dims
** (sizes, input strides, output strides) and reduced dims (sizes, input strides),
** size-1 dims dropped and neighbours that walk memory as one dim merged (so a
** contiguous tensor is one reduced dim and at most one kept dim). Output k's
** offsets come from unravelling k over the kept dims, once per output; element
** r's offset is r * stride when one reduced dim is left (the common case: no
** division per element), else r unravelled over the reduced dims. Any strides
** (transposed, expanded with stride 0) and any mask work without a copy.
**
** Work, picked from the shape alone:
**   seq    many short reductions (K >= 2048, R <= 32) and column reductions (the
**          innermost kept dim contiguous, no reduced dim contiguous): one thread
**          per output folds its elements in order (k_reduce_seq, k_arg_seq,
**          k_softmax_seq), so a warp's loads are contiguous across outputs.
**   warp   rows of R <= 512: one warp per output, 8 outputs per block; the
**          warp's lanes fold strided shares and combine them with shuffles
**          (reduce and softmax; arg_reduce keeps a block per output).
**   block  longer rows: one block (32..256 threads) per output, the threads'
**          shares combined with shuffles and then across warps in shared memory.
**   split  few outputs with long slices (a full sum(), norm() of a big tensor):
**          each output's R elements are cut into S chunks, K*S ~ 1024 blocks in
**          all, enough to fill every SM of a large GPU; each block writes its
**          chunk's partial to a workspace, and a second kernel combines each
**          output's S partials in chunk order. var and logsumexp need a shift
**          (the mean, the max) before their main pass: it is a split pass and a
**          combine of its own, four launches in all.
** The split count depends on the shape only (not on the device's SM count), and
** nothing uses atomics: the same shape on any GPU, or on the emulator, folds in
** the same order and gives the same bits run to run.
**
** Loads. A float32 slice that is contiguous (one reduced dim of stride 1) is
** read with 16-byte float4 loads, four in flight per thread (a block's row of
** 4096 floats is then one round trip to memory, not two): the first elements
** up to a 16-byte boundary and the last few are read one by one. The folding
** order within a thread stays r = t, t + T, ... in vector units, so it depends
** on the shape and the slice's alignment only.
**
** Semantics follow the CPU backend (core/cpu/reduce.c): floating inputs
** accumulate in double (sums, products, exp sums, norms), integer sums and
** products in int64 with two's complement wrap-around, integer max/min in int64;
** max/min propagate NaN; any/all count non-zeros (NaN counts). var = mean first,
** then the sum of squared deviations / max(R - correction, 0); logsumexp = max
** first (0 when it is infinite), then log(sum(exp(x - max))) + max. arg_reduce:
** the first NaN, else the first extreme (ties go to the lower index).
**
** softmax reads each row twice, not three times: one pass keeps a running
** (max m, sum s of exp(x - m)) per thread, rescaling s when m grows, and the
** pairs are combined as (max, s1 exp(m1 - m) + s2 exp(m2 - m)); a second pass
** writes. -inf elements add nothing (a row of only -inf is NaN, as on the CPU),
** +inf makes the sum NaN, NaN makes the row NaN. As the CPU's float32 rows,
** float inputs take their exponentials in float32 with the sums in double, and
** the written value is computed in float32 (float64 inputs: all in double).
*/
#include "k_reduce_args.h"
#include "device.h"
#include "dtype_dev.h"

/* -- Device helpers ------------------------------------------------------------------ */

/* input offset of output k (elements); *oo gets its output offset. Once per
** output, so the divisions here are not per element. */
EMK_DEVICE int64_t kept_off(const rgeom *g, const int64_t *kost, int64_t k, int64_t *oo) {
  if (g->nk <= 1) {
    *oo = k * kost[0];
    return k * g->kst[0];
  }
  int64_t io = 0, o = 0;
  for (int d = g->nk - 1; d >= 0; d--) {
    int64_t i = k % g->ksz[d];
    k /= g->ksz[d];
    io += i * g->kst[d];
    o += i * kost[d];
  }
  *oo = o;
  return io;
}

EMK_DEVICE int64_t red_off(const rgeom *g, int64_t r, int64_t *oo) {
  if (g->nr <= 1) {
    if (oo) *oo = r * g->rost[0];
    return r * g->rst[0];
  }
  int64_t io = 0, o = 0;
  for (int d = g->nr - 1; d >= 0; d--) {
    int64_t i = r % g->rsz[d];
    r /= g->rsz[d];
    io += i * g->rst[d];
    o += i * g->rost[d];
  }
  if (oo) *oo = o;
  return io;
}

EMK_DEVICE double kind_id(int kind) {
  switch (kind) {
  case K_PROD: return 1.0;
  case K_MAX: return -INFINITY;
  case K_MIN: case K_MINABS: return INFINITY;
  default: return 0.0;
  }
}

EMK_DEVICE double comb_f(int kind, double a, double b) {
  switch (kind) {
  case K_PROD: return a * b;
  case K_MAX: case K_MAXABS: return ((b > a) || (b != b)) ? b : a;
  case K_MIN: case K_MINABS: return ((b < a) || (b != b)) ? b : a;
  default: return a + b;
  }
}

EMK_DEVICE double expr_f(int kind, double x, double s, double p) {
  switch (kind) {
  case K_SUMABS: case K_MAXABS: case K_MINABS: return fabs(x);
  case K_SUMSQ: return x * x;
  case K_SUMPOW: return pow(fabs(x), p);
  case K_CNTNZ: return x != 0 ? 1.0 : 0.0;
  case K_SUMEXP: return exp(x - s);
  case K_SUMSQDEV: return (x - s) * (x - s);
  default: return x;
  }
}

EMK_DEVICE int64_t comb_i(int kind, int64_t a, int64_t b) {
  switch (kind) {
  case KI_PROD: return (int64_t)((uint64_t)a * (uint64_t)b);
  case KI_MAX: return b > a ? b : a;
  case KI_MIN: return b < a ? b : a;
  default: return (int64_t)((uint64_t)a + (uint64_t)b);
  }
}

EMK_DEVICE int64_t kind_id_i(int kind) {
  switch (kind) {
  case KI_PROD: return 1;
  case KI_MAX: return INT64_MIN;
  case KI_MIN: return INT64_MAX;
  default: return 0;
  }
}

EMK_DEVICE void store_i64(char *p, int dt, int64_t v) {
  switch (dt) {
  case EM_INT32: *(int32_t *)p = (int32_t)v; break;
  case EM_UINT8: *(uint8_t *)p = (uint8_t)v; break;
  case EM_BOOL: *(uint8_t *)p = v != 0; break;
  case EM_INT64: *(int64_t *)p = v; break;
  default: emk_store_f64(p, dt, (double)v); break;
  }
}

/* -- Groups: the threads that share one output -------------------------------------
** A group is a warp (blockDim.x == 32: one output per warp, blockDim.y of them in
** a block) or the whole block (blockDim.y == 1). Its partials combine in a fixed
** order: a shuffle-down tree in each warp, then (a block of several warps) warp
** 0 folds the warps' results in warp order with the same tree; every thread of
** the group gets lane 0's value. sh holds at least 32 entries. */
EMK_DEVICE double group_f(double *sh, double v, int kind) {
  for (int o = 16; o > 0; o >>= 1) v = comb_f(kind, v, emk_shfl_down_sync(EMK_FULL_MASK, v, o));
  if (blockDim.x == 32) return emk_shfl_sync(EMK_FULL_MASK, v, 0);
  int t = (int)threadIdx.x, nw = (int)blockDim.x >> 5;
  if ((t & 31) == 0) sh[t >> 5] = v;
  EMK_SYNCTHREADS();
  if (t < 32) {
    double u = t < nw ? sh[t] : kind_id(kind);
    for (int o = 16; o > 0; o >>= 1)
      u = comb_f(kind, u, emk_shfl_down_sync(EMK_FULL_MASK, u, o));
    if (t == 0) sh[0] = u;      /* warp 0 read sh before its first shuffle */
  }
  EMK_SYNCTHREADS();
  double r = sh[0];
  EMK_SYNCTHREADS();             /* sh is reused next */
  return r;
}

EMK_DEVICE int64_t group_i(int64_t *sh, int64_t v, int kind) {
  for (int o = 16; o > 0; o >>= 1) v = comb_i(kind, v, emk_shfl_down_sync(EMK_FULL_MASK, v, o));
  if (blockDim.x == 32) return emk_shfl_sync(EMK_FULL_MASK, v, 0);
  int t = (int)threadIdx.x, nw = (int)blockDim.x >> 5;
  if ((t & 31) == 0) sh[t >> 5] = v;
  EMK_SYNCTHREADS();
  if (t < 32) {
    int64_t u = t < nw ? sh[t] : kind_id_i(kind);
    for (int o = 16; o > 0; o >>= 1)
      u = comb_i(kind, u, emk_shfl_down_sync(EMK_FULL_MASK, u, o));
    if (t == 0) sh[0] = u;
  }
  EMK_SYNCTHREADS();
  int64_t r = sh[0];
  EMK_SYNCTHREADS();
  return r;
}

/* Where a float32 slice starting at p reaches a 16-byte boundary: the count of
** leading elements read one by one before the float4 loads (0..3). */
EMK_DEVICE int64_t head_of(const float *p) {
  return (int64_t)(((16 - ((uintptr_t)p & 15)) & 15) >> 2);
}

/* One thread's share (elements r0 + t, r0 + t + T, ... below r1) of the slice
** at input offset io, folded in that order (float4 units on the vector path). */
#define FOLD_(x) acc = comb_f(kind, acc, expr_f(kind, (double)(x), s, p))
EMK_DEVICE double share_f(const rgeom *g, int64_t io, int64_t r0, int64_t r1, int64_t t,
                          int64_t T, int kind, double s, double p) {
  double acc = kind_id(kind);
  if (g->vec) {
    const float *row = (const float *)g->in + io;
    int64_t a0 = r0 + head_of(row + r0);
    if (a0 > r1) a0 = r1;
    for (int64_t r = r0 + t; r < a0; r += T) FOLD_(row[r]);
    const emk_float4 *v = (const emk_float4 *)(row + a0);
    int64_t n4 = (r1 - a0) >> 2, j = t;
    for (; j + 3 * T < n4; j += 4 * T) {    /* four loads in flight, folded in order */
      emk_float4 x = v[j], y = v[j + T], z = v[j + 2 * T], u = v[j + 3 * T];
      FOLD_(x.x); FOLD_(x.y); FOLD_(x.z); FOLD_(x.w);
      FOLD_(y.x); FOLD_(y.y); FOLD_(y.z); FOLD_(y.w);
      FOLD_(z.x); FOLD_(z.y); FOLD_(z.z); FOLD_(z.w);
      FOLD_(u.x); FOLD_(u.y); FOLD_(u.z); FOLD_(u.w);
    }
    for (; j < n4; j += T) {
      emk_float4 x = v[j];
      FOLD_(x.x); FOLD_(x.y); FOLD_(x.z); FOLD_(x.w);
    }
    for (int64_t r = a0 + 4 * n4 + t; r < r1; r += T) FOLD_(row[r]);
    return acc;
  }
  for (int64_t r = r0 + t; r < r1; r += T)
    FOLD_(emk_load_f64(g->in + (io + red_off(g, r, NULL)) * g->iesz, g->idt));
  return acc;
}
#undef FOLD_

EMK_DEVICE int64_t share_i(const rgeom *g, int64_t io, int64_t r0, int64_t r1, int64_t t,
                           int64_t T, int kind) {
  int64_t acc = kind_id_i(kind);
  for (int64_t r = r0 + t; r < r1; r += T)
    acc = comb_i(kind, acc, emk_load_i64(g->in + (io + red_off(g, r, NULL)) * g->iesz, g->idt));
  return acc;
}

/* -- reduce / var / norm ----------------------------------------------------------- */

/* the final step of output k (value v of the last pass, s its shift) into o */
EMK_DEVICE void finish(const red_args *a, char *o, double v, double s) {
  double R = (double)a->g.R;
  switch (a->fin) {
  case F_MEAN: v = v / R; break;
  case F_SQRT: v = sqrt(v); break;
  case F_ROOT: v = pow(v, a->arg); break;
  case F_LSE: v = log(v) + s; break;
  case F_VAR: case F_STD: {
    double dof = R - a->arg;
    v = v / (dof > 0 ? dof : 0);
    if (a->fin == F_STD) v = sqrt(v);
    break;
  }
  case F_ANY: v = v > 0; break;
  case F_ALL: v = v == R; break;
  default: break;
  }
  emk_store_f64(o, a->g.odt, v);
}

/* One group (a warp or the block) per output; the group's threads fold strided
** shares of the whole slice. var and logsumexp make their first pass here too. */
EMK_KERNEL_SYNC(k_reduce, red_args) {
  EMK_SHARED(double, shd, 32);
  EMK_SHARED(int64_t, shi, 32);
  const rgeom *g = &a.g;
  int64_t t = threadIdx.x, T = blockDim.x, step = (int64_t)gridDim.x * blockDim.y;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; k < g->K; k += step) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    char *o = g->out + oo * g->oesz;
    if (a.kind >= KI_SUM) {
      int64_t acc = group_i(shi, share_i(g, io, 0, g->R, t, T, a.kind), a.kind);
      if (t == 0) store_i64(o, g->odt, acc);
      continue;
    }
    double s = 0;
    int kind = a.kind;
    if (a.fin == F_VAR || a.fin == F_STD) {
      s = group_f(shd, share_f(g, io, 0, g->R, t, T, K_SUM, 0, 0), K_SUM) / (double)g->R;
      kind = K_SUMSQDEV;
    } else if (a.fin == F_LSE) {
      s = group_f(shd, share_f(g, io, 0, g->R, t, T, K_MAX, 0, 0), K_MAX);
      if (s == INFINITY || s == -INFINITY) s = 0;
      kind = K_SUMEXP;
    }
    double v = group_f(shd, share_f(g, io, 0, g->R, t, T, kind, s, a.p), kind);
    if (t == 0) finish(&a, o, v, s);
  }
}

/* Split work, first kernel: block b folds chunk b % S of output b / S (one pass
** of kind a.kind; var's and logsumexp's main pass shifted by a.shift[k]) into
** part[b]. */
EMK_KERNEL_SYNC(k_reduce_part, red_args) {
  EMK_SHARED(double, shd, 32);
  EMK_SHARED(int64_t, shi, 32);
  const rgeom *g = &a.g;
  int64_t t = threadIdx.x, T = blockDim.x;
  for (int64_t b = blockIdx.x; b < g->K * a.S; b += gridDim.x) {
    int64_t k = b / a.S, r0 = (b % a.S) * a.chunk, r1 = r0 + a.chunk, oo;
    if (r1 > g->R) r1 = g->R;
    int64_t io = kept_off(g, g->kost, k, &oo);
    if (a.kind >= KI_SUM) {
      int64_t v = group_i(shi, share_i(g, io, r0, r1, t, T, a.kind), a.kind);
      if (t == 0) ((int64_t *)a.part)[b] = v;
    } else {
      int shifted = a.stage == 0 && (a.fin == F_VAR || a.fin == F_STD || a.fin == F_LSE);
      double sh = shifted ? a.shift[k] : 0;
      double v = group_f(shd, share_f(g, io, r0, r1, t, T, a.kind, sh, a.p), a.kind);
      if (t == 0) a.part[b] = v;
    }
  }
}

/* Split work, second kernel: one block per output folds its S partials (thread
** j takes j, j + T, ..., then the fixed tree), and gives the result (stage 0)
** or the shift of the next pass (1: var's mean, 2: logsumexp's max, 0 if
** infinite). */
EMK_KERNEL_SYNC(k_reduce_comb, red_args) {
  EMK_SHARED(double, shd, 32);
  EMK_SHARED(int64_t, shi, 32);
  const rgeom *g = &a.g;
  int64_t t = threadIdx.x, T = blockDim.x;
  for (int64_t k = blockIdx.x; k < g->K; k += gridDim.x) {
    int64_t oo;
    kept_off(g, g->kost, k, &oo);
    char *o = g->out + oo * g->oesz;
    if (a.kind >= KI_SUM) {
      const int64_t *pk = (const int64_t *)a.part + k * a.S;
      int64_t acc = kind_id_i(a.kind);
      for (int64_t j = t; j < a.S; j += T) acc = comb_i(a.kind, acc, pk[j]);
      acc = group_i(shi, acc, a.kind);
      if (t == 0) store_i64(o, g->odt, acc);
      continue;
    }
    const double *pk = a.part + k * a.S;
    double acc = kind_id(a.kind);
    for (int64_t j = t; j < a.S; j += T) acc = comb_f(a.kind, acc, pk[j]);
    double v = group_f(shd, acc, a.kind);
    if (t != 0) continue;
    if (a.stage == 1) a.shift[k] = v / (double)g->R;
    else if (a.stage == 2) a.shift[k] = (v == INFINITY || v == -INFINITY) ? 0 : v;
    else finish(&a, o, v, a.fin == F_LSE ? a.shift[k] : 0);
  }
}

/* One thread per output: many short reductions, or columns (a kept dim
** contiguous in the input, so a warp's loads are contiguous). */
EMK_KERNEL(k_reduce_seq, red_args) {
  const rgeom *g = &a.g;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < g->K; k += step) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    char *o = g->out + oo * g->oesz;
    if (a.kind >= KI_SUM) {
      store_i64(o, g->odt, share_i(g, io, 0, g->R, 0, 1, a.kind));
      continue;
    }
    double s = 0;
    int kind = a.kind;
    if (a.fin == F_VAR || a.fin == F_STD) {
      s = share_f(g, io, 0, g->R, 0, 1, K_SUM, 0, 0) / (double)g->R;
      kind = K_SUMSQDEV;
    } else if (a.fin == F_LSE) {
      s = share_f(g, io, 0, g->R, 0, 1, K_MAX, 0, 0);
      if (s == INFINITY || s == -INFINITY) s = 0;
      kind = K_SUMEXP;
    }
    finish(&a, o, share_f(g, io, 0, g->R, 0, 1, kind, s, a.p), s);
  }
}

/* -- arg_reduce ------------------------------------------------------------------------ */

/* Is candidate (x, xi) better than (b, bi)? NaN beats everything but an earlier
** NaN; equal values go to the lower index. bi < 0: nothing yet. */
EMK_DEVICE int better_f(double x, int64_t xi, double b, int64_t bi, int want_max) {
  if (xi < 0) return 0;
  if (bi < 0) return 1;
  int xn = x != x, bn = b != b;
  if (xn || bn) return xn && (!bn || xi < bi);
  if (x == b) return xi < bi;
  return want_max ? x > b : x < b;
}

EMK_DEVICE int better_i(int64_t x, int64_t xi, int64_t b, int64_t bi, int want_max) {
  if (xi < 0) return 0;
  if (bi < 0) return 1;
  if (x == b) return xi < bi;
  return want_max ? x > b : x < b;
}

/* the best of elements r0 + t, r0 + t + T, ... below r1 into (bf|bv, bx) */
EMK_DEVICE void arg_share(const arg_args *a, int64_t io, int64_t r0, int64_t r1, int64_t t,
                          int64_t T, double *bf, int64_t *bv, int64_t *bx) {
  const rgeom *g = &a->g;
  for (int64_t r = r0 + t; r < r1; r += T) {
    const char *p = g->in + (io + red_off(g, r, NULL)) * g->iesz;
    if (a->i64) {
      int64_t x = emk_load_i64(p, g->idt);
      if (better_i(x, r, *bv, *bx, a->want_max)) { *bv = x; *bx = r; }
    } else {
      double x = emk_load_f64(p, g->idt);
      if (better_f(x, r, *bf, *bx, a->want_max)) { *bf = x; *bx = r; }
    }
  }
}

/* The block's candidates combined in a fixed tree order; every thread gets the
** winner. Called by every thread of the block. */
EMK_DEVICE void arg_block(const arg_args *a, double *shd, int64_t *shv, int64_t *shx,
                          double *bf, int64_t *bv, int64_t *bx) {
  int t = (int)threadIdx.x;
  shd[t] = *bf;
  shv[t] = *bv;
  shx[t] = *bx;
  EMK_SYNCTHREADS();
  for (int s = (int)blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      int take = a->i64 ? better_i(shv[t + s], shx[t + s], shv[t], shx[t], a->want_max)
                        : better_f(shd[t + s], shx[t + s], shd[t], shx[t], a->want_max);
      if (take) { shd[t] = shd[t + s]; shv[t] = shv[t + s]; shx[t] = shx[t + s]; }
    }
    EMK_SYNCTHREADS();
  }
  *bf = shd[0];
  *bv = shv[0];
  *bx = shx[0];
  EMK_SYNCTHREADS();
}

/* output k's index w (+ base) and, when asked, its value */
EMK_DEVICE void arg_store(const arg_args *a, int64_t k, int64_t w) {
  const rgeom *g = &a->g;
  int64_t oo, vo, io = kept_off(g, g->kost, k, &oo);
  *(int64_t *)(g->out + oo * 8) = w + a->base;
  if (a->vout) {
    kept_off(g, a->vkost, k, &vo);
    const char *src = g->in + (io + red_off(g, w, NULL)) * g->iesz;
    char *dst = a->vout + vo * g->iesz;
    for (int b = 0; b < g->iesz; b++) dst[b] = src[b];
  }
}

EMK_KERNEL_SYNC(k_arg, arg_args) {
  EMK_SHARED(double, shd, RT);
  EMK_SHARED(int64_t, shv, RT);
  EMK_SHARED(int64_t, shx, RT);
  const rgeom *g = &a.g;
  for (int64_t k = blockIdx.x; k < g->K; k += gridDim.x) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo), bv = 0, bx = -1;
    double bf = 0;
    arg_share(&a, io, 0, g->R, threadIdx.x, blockDim.x, &bf, &bv, &bx);
    arg_block(&a, shd, shv, shx, &bf, &bv, &bx);
    if (threadIdx.x == 0) arg_store(&a, k, bx);
  }
}

/* Split work: block b's best of chunk b % S of output b / S into pf/pv/px[b]. */
EMK_KERNEL_SYNC(k_arg_part, arg_args) {
  EMK_SHARED(double, shd, RT);
  EMK_SHARED(int64_t, shv, RT);
  EMK_SHARED(int64_t, shx, RT);
  const rgeom *g = &a.g;
  for (int64_t b = blockIdx.x; b < g->K * a.S; b += gridDim.x) {
    int64_t k = b / a.S, r0 = (b % a.S) * a.chunk, r1 = r0 + a.chunk, oo, bv = 0, bx = -1;
    if (r1 > g->R) r1 = g->R;
    int64_t io = kept_off(g, g->kost, k, &oo);
    double bf = 0;
    arg_share(&a, io, r0, r1, threadIdx.x, blockDim.x, &bf, &bv, &bx);
    arg_block(&a, shd, shv, shx, &bf, &bv, &bx);
    if (threadIdx.x == 0) { a.pf[b] = bf; a.pv[b] = bv; a.px[b] = bx; }
  }
}

/* Split work: one block per output picks the best of its S candidates (their
** indices are the slice's, so ties still go to the lowest). */
EMK_KERNEL_SYNC(k_arg_comb, arg_args) {
  EMK_SHARED(double, shd, RT);
  EMK_SHARED(int64_t, shv, RT);
  EMK_SHARED(int64_t, shx, RT);
  const rgeom *g = &a.g;
  for (int64_t k = blockIdx.x; k < g->K; k += gridDim.x) {
    int64_t bv = 0, bx = -1;
    double bf = 0;
    for (int64_t j = k * a.S + threadIdx.x; j < (k + 1) * a.S; j += blockDim.x) {
      int take = a.i64 ? better_i(a.pv[j], a.px[j], bv, bx, a.want_max)
                       : better_f(a.pf[j], a.px[j], bf, bx, a.want_max);
      if (take) { bf = a.pf[j]; bv = a.pv[j]; bx = a.px[j]; }
    }
    arg_block(&a, shd, shv, shx, &bf, &bv, &bx);
    if (threadIdx.x == 0) arg_store(&a, k, bx);
  }
}

/* One thread per output, its elements scanned in order: a strictly better
** candidate replaces the best, so ties and NaNs keep the first, as above. */
EMK_KERNEL(k_arg_seq, arg_args) {
  const rgeom *g = &a.g;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < g->K; k += step) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo), bv = 0, bx = -1;
    double bf = 0;
    arg_share(&a, io, 0, g->R, 0, 1, &bf, &bv, &bx);
    arg_store(&a, k, bx);
  }
}

/* -- softmax --------------------------------------------------------------------------- */

/* exp(d): in float32 for float inputs (as the CPU's float32 rows), else double */
EMK_DEVICE double ms_exp(double d, int fexp) {
  return fexp ? (double)expf((float)d) : exp(d);
}

/* (m, s) <- the running (max, sum of exp(x - max)) with x added; see the top */
EMK_DEVICE void ms_add(double *m, double *s, double x, int fexp) {
  if (x != x) {
    *m = x;
    *s = x;
  } else if (x > *m) {
    double kept = *s == 0 ? 0 : *s * ms_exp(*m - x, fexp);
    *s = kept + (x == INFINITY ? (double)NAN : 1.0);
    *m = x;
  } else if (x != -INFINITY) {
    *s += ms_exp(x - *m, fexp);
  }
}

/* (m, s) <- (m, s) combined with (m2, s2) */
EMK_DEVICE void ms_comb(double *m, double *s, double m2, double s2, int fexp) {
  if (m2 != m2) { *m = m2; *s = m2; return; }
  if (*m != *m) return;
  double mm = m2 > *m ? m2 : *m;
  double u = *s == 0 ? 0 : *s * ms_exp(*m - mm, fexp);
  double w = s2 == 0 ? 0 : s2 * ms_exp(m2 - mm, fexp);
  *m = mm;
  *s = u + w;
}

/* one thread's running (m, s) over r = t, t + T, ... of the row at io */
EMK_DEVICE void ms_share(const rgeom *g, int64_t io, int64_t t, int64_t T, int fexp,
                         double *m, double *s) {
  *m = -INFINITY;
  *s = 0;
  if (g->vec) {
    const float *row = (const float *)g->in + io;
    int64_t a0 = head_of(row), R = g->R;
    if (a0 > R) a0 = R;
    for (int64_t r = t; r < a0; r += T) ms_add(m, s, row[r], fexp);
    const emk_float4 *v = (const emk_float4 *)(row + a0);
    int64_t n4 = (R - a0) >> 2;
    int64_t j = t;
    for (; j + 3 * T < n4; j += 4 * T) {   /* four loads in flight, added in order */
      emk_float4 q[4] = {v[j], v[j + T], v[j + 2 * T], v[j + 3 * T]};
      for (int i = 0; i < 4; i++) {
        ms_add(m, s, q[i].x, fexp); ms_add(m, s, q[i].y, fexp);
        ms_add(m, s, q[i].z, fexp); ms_add(m, s, q[i].w, fexp);
      }
    }
    for (; j < n4; j += T) {
      emk_float4 x = v[j];
      ms_add(m, s, x.x, fexp); ms_add(m, s, x.y, fexp);
      ms_add(m, s, x.z, fexp); ms_add(m, s, x.w, fexp);
    }
    for (int64_t r = a0 + 4 * n4 + t; r < R; r += T) ms_add(m, s, row[r], fexp);
    return;
  }
  for (int64_t r = t; r < g->R; r += T)
    ms_add(m, s, emk_load_f64(g->in + (io + red_off(g, r, NULL)) * g->iesz, g->idt), fexp);
}

/* The group's (m, s) pairs combined as group_f combines values. */
EMK_DEVICE void group_ms(double *shm, double *shs, double *m, double *s, int fexp) {
  for (int o = 16; o > 0; o >>= 1) {
    double m2 = emk_shfl_down_sync(EMK_FULL_MASK, *m, o);
    double s2 = emk_shfl_down_sync(EMK_FULL_MASK, *s, o);
    ms_comb(m, s, m2, s2, fexp);
  }
  if (blockDim.x == 32) {
    *m = emk_shfl_sync(EMK_FULL_MASK, *m, 0);
    *s = emk_shfl_sync(EMK_FULL_MASK, *s, 0);
    return;
  }
  int t = (int)threadIdx.x, nw = (int)blockDim.x >> 5;
  if ((t & 31) == 0) { shm[t >> 5] = *m; shs[t >> 5] = *s; }
  EMK_SYNCTHREADS();
  if (t < 32) {
    double um = t < nw ? shm[t] : -INFINITY, us = t < nw ? shs[t] : 0;
    for (int o = 16; o > 0; o >>= 1) {
      double m2 = emk_shfl_down_sync(EMK_FULL_MASK, um, o);
      double s2 = emk_shfl_down_sync(EMK_FULL_MASK, us, o);
      ms_comb(&um, &us, m2, s2, fexp);
    }
    if (t == 0) { shm[0] = um; shs[0] = us; }
  }
  EMK_SYNCTHREADS();
  *m = shm[0];
  *s = shs[0];
  EMK_SYNCTHREADS();
}

/* The write pass over r = t, t + T, ... of row k, given its max m and sum s. */
EMK_DEVICE void smax_write(const smax_args *a, int64_t io, int64_t oo, int64_t t, int64_t T,
                           int fexp, double m, double s) {
  const rgeom *g = &a->g;
  if (m == -INFINITY) s = NAN;          /* a row of only -inf, as the CPU's */
  double ls = log(s), inv = 1.0 / s;
  if (!fexp) {
    for (int64_t r = t; r < g->R; r += T) {
      int64_t ro, ri = red_off(g, r, &ro);
      double x = emk_load_f64(g->in + (io + ri) * g->iesz, g->idt);
      emk_store_f64(g->out + (oo + ro) * g->oesz, g->odt,
                    a->log ? (x - m) - ls : exp(x - m) * inv);
    }
    return;
  }
  float mf = (float)m, lsf = (float)ls, invf = (float)inv;
  int lg = a->log;
  const float *row = (const float *)g->in + io;
  float *orow = (float *)g->out + oo;
  int64_t R = g->R;
  if (g->vec && g->ovec && (((uintptr_t)row ^ (uintptr_t)orow) & 15) == 0) {
    int64_t a0 = head_of(row);
    if (a0 > R) a0 = R;
    for (int64_t r = t; r < a0; r += T)
      orow[r] = lg ? (row[r] - mf) - lsf : expf(row[r] - mf) * invf;
    const emk_float4 *v = (const emk_float4 *)(row + a0);
    emk_float4 *w = (emk_float4 *)(orow + a0);
    int64_t n4 = (R - a0) >> 2;
    int64_t j = t;
    for (; j + 3 * T < n4; j += 4 * T) {   /* four loads in flight */
      emk_float4 q[4] = {v[j], v[j + T], v[j + 2 * T], v[j + 3 * T]};
      for (int i = 0; i < 4; i++) {
        emk_float4 x = q[i], y;
        if (lg) {
          y.x = (x.x - mf) - lsf; y.y = (x.y - mf) - lsf;
          y.z = (x.z - mf) - lsf; y.w = (x.w - mf) - lsf;
        } else {
          y.x = expf(x.x - mf) * invf; y.y = expf(x.y - mf) * invf;
          y.z = expf(x.z - mf) * invf; y.w = expf(x.w - mf) * invf;
        }
        w[j + i * T] = y;
      }
    }
    for (; j < n4; j += T) {
      emk_float4 x = v[j], y;
      if (lg) {
        y.x = (x.x - mf) - lsf; y.y = (x.y - mf) - lsf;
        y.z = (x.z - mf) - lsf; y.w = (x.w - mf) - lsf;
      } else {
        y.x = expf(x.x - mf) * invf; y.y = expf(x.y - mf) * invf;
        y.z = expf(x.z - mf) * invf; y.w = expf(x.w - mf) * invf;
      }
      w[j] = y;
    }
    for (int64_t r = a0 + 4 * n4 + t; r < R; r += T)
      orow[r] = lg ? (row[r] - mf) - lsf : expf(row[r] - mf) * invf;
    return;
  }
  for (int64_t r = t; r < R; r += T) {
    int64_t ro, ri = red_off(g, r, &ro);
    float x = (float)emk_load_f64(g->in + (io + ri) * g->iesz, g->idt);
    emk_store_f64(g->out + (oo + ro) * g->oesz, g->odt,
                  (double)(lg ? (x - mf) - lsf : expf(x - mf) * invf));
  }
}

/* One group (a warp or the block) per row: the online pass, then the write. */
EMK_KERNEL_SYNC(k_softmax, smax_args) {
  EMK_SHARED(double, shm, 32);
  EMK_SHARED(double, shs, 32);
  const rgeom *g = &a.g;
  int fexp = g->idt != EM_FLOAT64;
  int64_t t = threadIdx.x, T = blockDim.x, step = (int64_t)gridDim.x * blockDim.y;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; k < g->K; k += step) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    double m, s;
    ms_share(g, io, t, T, fexp, &m, &s);
    group_ms(shm, shs, &m, &s, fexp);
    smax_write(&a, io, oo, t, T, fexp, m, s);
  }
}

/* One thread per row: the online pass and the write, in order. */
EMK_KERNEL(k_softmax_seq, smax_args) {
  const rgeom *g = &a.g;
  int fexp = g->idt != EM_FLOAT64;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < g->K; k += step) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    double m, s;
    ms_share(g, io, 0, 1, fexp, &m, &s);
    smax_write(&a, io, oo, 0, 1, fexp, m, s);
  }
}
