/*
** reduce_arg.c -- CPU max/min along one dim with the index of the first hit
** (emi_cpu_arg_reduce: max(dim), min(dim), argmax, argmin).
**
** NaN counts as the largest (and the smallest) value: the first NaN wins, as in
** PyTorch. Values are copied bytewise from the winning element, so they keep a's
** dtype exactly. Floats and the small integer dtypes compare as doubles (exact);
** int64 as int64. Two shapes, as for the other reductions: a contiguous dim is
** scanned row by row (float32 rows: the vectorised extreme first, then its
** first position); otherwise, when a kept dim is contiguous, whole rows update
** per-column best values and indices.
*/
#include "reduce.h"
#include "vecmath.h"

enum { CB = EMI_CB, CHUNK = EMI_CHUNK };

typedef struct ajob {
  emi_rplan pl;
  int want_max, ibase, i64;
  char *vbase;             /* values data or NULL */
  int64_t *ibase_out;      /* indices data */
  int64_t M, ncb;          /* OUTER: vector length, column blocks */
  int kon;
  int64_t kosz[EM_MAX_DIMS], kost[EM_MAX_DIMS], kooo[EM_MAX_DIMS];
} ajob;

static inline int abetter_f(double x, double best, int want_max) {
  if (x != x) return best == best;               /* first NaN wins */
  return want_max ? x > best : x < best;
}

/* Index of the winner among n elements st bytes apart. */
static int64_t arg_scan(const ajob *j, const char *p, int64_t n, int64_t st) {
  const emi_rplan *pl = &j->pl;
  int64_t bi = 0;
  if (pl->dt == EM_FLOAT32 && st == 4) {
    /* Fast path: the extreme value by the vectorised kernel, then its first
    ** position (or the first NaN's). */
    const float *a = (const float *)p;
    double m = j->want_max ? emi_extreme_f32(a, n, 1) : emi_extreme_f32(a, n, 0);
    if (m != m) { while (a[bi] == a[bi]) bi++; }
    else { float mf = (float)m; while (a[bi] != mf) bi++; }
    return bi;
  }
  if (j->i64) {
    int64_t buf[CHUNK], best = 0;
    for (int64_t c = 0; c < n; c += CHUNK) {
      int64_t m = n - c < CHUNK ? n - c : CHUNK;
      emi_load_row_i64(buf, p + c * st, m, st, pl->dt);
      if (c == 0) best = buf[0];
      for (int64_t i = 0; i < m; i++)
        if (j->want_max ? buf[i] > best : buf[i] < best) { best = buf[i]; bi = c + i; }
    }
    return bi;
  }
  double buf[CHUNK], best = 0;
  for (int64_t c = 0; c < n; c += CHUNK) {
    int64_t m = n - c < CHUNK ? n - c : CHUNK;
    emi_load_row_f64(buf, p + c * st, m, st, pl->dt);
    if (c == 0) best = buf[0];
    for (int64_t i = 0; i < m; i++) {
      if (abetter_f(buf[i], best, j->want_max)) { best = buf[i]; bi = c + i; }
      if (best != best) return bi;
    }
  }
  return bi;
}

static void arg_put(const ajob *j, int64_t k, const char *p0, int64_t idx) {
  const emi_rplan *pl = &j->pl;
  j->ibase_out[k] = idx + j->ibase;
  if (j->vbase)
    memcpy(j->vbase + k * pl->esz, p0 + idx * pl->rst[0], (size_t)pl->esz);
}

static void arg_inner_task(void *ctx, int64_t k0, int64_t k1) {
  const ajob *j = ctx;
  const emi_rplan *pl = &j->pl;
  emi_walker kw;
  emi_walk_init(&kw, pl->nk, pl->ksz, pl->kst, NULL, k0);
  for (int64_t k = k0; k < k1; k++, emi_walk_next(&kw)) {
    const char *p0 = pl->base + kw.off;
    arg_put(j, k, p0, arg_scan(j, p0, pl->R, pl->rst[0]));
  }
}

/* Columns contiguous in a: best[c] and idx[c] per column, rows along dim. */
static void arg_outer_task(void *ctx, int64_t t0, int64_t t1) {
  const ajob *j = ctx;
  const emi_rplan *pl = &j->pl;
  int64_t vos = pl->kos[pl->vk], esz = pl->esz, rs = pl->rst[0];
  for (int64_t t = t0; t < t1; t++) {
    int64_t cb = t % j->ncb, ko = t / j->ncb;
    int64_t c0 = cb * CB, W = j->M - c0 < CB ? j->M - c0 : CB;
    emi_walker kw;
    emi_walk_init(&kw, j->kon, j->kosz, j->kost, j->kooo, ko);
    const char *p0 = pl->base + kw.off + c0 * esz;
    int64_t idx[CB];
    for (int64_t c = 0; c < W; c++) idx[c] = 0;
    if (j->i64) {
      int64_t best[CB], buf[CB];
      emi_load_row_i64(best, p0, W, esz, pl->dt);
      for (int64_t r = 1; r < pl->R; r++) {
        emi_load_row_i64(buf, p0 + r * rs, W, esz, pl->dt);
        for (int64_t c = 0; c < W; c++)
          if (j->want_max ? buf[c] > best[c] : buf[c] < best[c]) { best[c] = buf[c]; idx[c] = r; }
      }
    } else if (pl->dt == EM_FLOAT32) {
      float best[CB];
      memcpy(best, p0, (size_t)W * 4);
      for (int64_t r = 1; r < pl->R; r++) {
        const float *a = (const float *)(p0 + r * rs);
        if (j->want_max) {
          for (int64_t c = 0; c < W; c++) {
            float x = a[c], b = best[c];
            int take = x > b || (x != x && b == b);
            best[c] = take ? x : b;
            idx[c] = take ? r : idx[c];
          }
        } else {
          for (int64_t c = 0; c < W; c++) {
            float x = a[c], b = best[c];
            int take = x < b || (x != x && b == b);
            best[c] = take ? x : b;
            idx[c] = take ? r : idx[c];
          }
        }
      }
    } else {
      double best[CB], buf[CB];
      emi_load_row_f64(best, p0, W, esz, pl->dt);
      for (int64_t r = 1; r < pl->R; r++) {
        emi_load_row_f64(buf, p0 + r * rs, W, esz, pl->dt);
        for (int64_t c = 0; c < W; c++)
          if (abetter_f(buf[c], best[c], j->want_max)) { best[c] = buf[c]; idx[c] = r; }
      }
    }
    int64_t ob = kw.off2 + c0 * vos;
    for (int64_t c = 0; c < W; c++) arg_put(j, ob + c * vos, p0 + c * esz, idx[c]);
  }
}

em_status emi_cpu_arg_reduce(emi_device *dev, em_tensor *values, em_tensor *indices,
                             const em_tensor *a, int dim, int want_max, int index_base) {
  em_state *S = dev->S;
  ajob j;
  emi_reduce_plan(&j.pl, a, a->ndim ? 1u << dim : 0);
  const emi_rplan *pl = &j.pl;
  j.want_max = want_max;
  j.ibase = index_base;
  j.i64 = !em_dtype_is_floating(a->dtype);
  j.vbase = values ? em_tensor_data(values) : NULL;
  j.ibase_out = em_tensor_data(indices);
  if (pl->K == 0) return EM_OK;
  if (pl->R == 0)
    return emi_error(S, EM_ERR_SHAPE, "%s: cannot reduce over dimension %lld of size 0 "
                     "(shape %s)", want_max ? "argmax" : "argmin", emi_ix(S, dim), emi_tshape(S, a));
  if (pl->outer && pl->R > 1) {
    j.M = pl->ksz[pl->vk];
    j.ncb = (j.M + CB - 1) / CB;
    j.kon = 0;
    for (int i = 0; i < pl->nk; i++) {
      if (i == pl->vk) continue;
      j.kosz[j.kon] = pl->ksz[i];
      j.kost[j.kon] = pl->kst[i];
      j.kooo[j.kon++] = pl->kos[i];
    }
    int64_t per = (j.M < CB ? j.M : CB) * pl->R;
    emi_parallel_dynamic(S, pl->K / j.M * j.ncb, 4 * per, arg_outer_task, &j);
  } else {
    emi_parallel_dynamic(S, pl->K, 4 * pl->R, arg_inner_task, &j);
  }
  return EM_OK;
}
