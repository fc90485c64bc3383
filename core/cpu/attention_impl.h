/*
** attention_impl.h -- the body of the fused attention kernels (attention.c),
** included once per compute type: T (float or double), GEMM (a function with
** emi_nn_sgemm's signature over T), EXP (the exponential over T) and SFX (the name
** suffix).
**
** Layout: every buffer is contiguous; q (B, L, E), k (B, S, E), kt and vt the
** transposes of k and v per batch (B, E, S) and (B, Ev, S), v (B, S, Ev), out
** (B, L, Ev), lse (B, L) the log of each row's softmax denominator (plus its
** running max). The mask is additive, read through strides (0 where broadcast).
** Queries go in blocks of QB rows and keys in blocks of KB: a QB x KB block of
** scores is all that exists of the L x S matrix at any time.
*/
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

typedef struct FN(att_args) {
  int64_t B, L, S, E, Ev, qblocks, kblocks;
  const T *q, *k, *v, *kt, *vt, *mask, *out, *dout, *delta;
  int64_t minner, mso, msi, msl, mss;   /* the mask's strides (see att_scores) */
  int causal, failed;   /* failed: a worker's scratch allocation failed */
  T scale;
  T *o, *lse, *dq, *dk, *dv;
} FN(att_args);

/* The scores of query rows [i0, i0+nq) against keys [j0, j0+nk) of batch b into
** s (nq x nk, row stride KB): scaled, the mask added, causal positions -inf. */
static void FN(att_scores)(const FN(att_args) *a, int64_t b, int64_t i0, int64_t nq,
                           int64_t j0, int64_t nk, T *s) {
  GEMM(nq, nk, a->E, a->q + (b * a->L + i0) * a->E, a->E, 1,
       a->kt + b * a->E * a->S + j0, a->S, s, KB, 0);
  for (int64_t i = 0; i < nq; i++) {
    T *row = s + i * KB;
    for (int64_t j = 0; j < nk; j++) row[j] *= a->scale;
    if (a->mask) {
      const T *m = a->mask + (b / a->minner) * a->mso + (b % a->minner) * a->msi +
                   (i0 + i) * a->msl + j0 * a->mss;
      for (int64_t j = 0; j < nk; j++) row[j] += m[j * a->mss];
    }
    if (a->causal)   /* key j0 + j is in query i0 + i's future when j > i0 + i - j0 */
      for (int64_t j = i0 + i - j0 + 1 < 0 ? 0 : i0 + i - j0 + 1; j < nk; j++) row[j] = -(T)INFINITY;
  }
}

/* The key blocks query block qb meets: all, or under causal those starting at or
** before its last row. */
static int64_t FN(att_kblocks_for)(const FN(att_args) *a, int64_t i0, int64_t nq) {
  if (!a->causal) return a->kblocks;
  int64_t last = i0 + nq - 1;
  int64_t n = last / KB + 1;
  return n < a->kblocks ? n : a->kblocks;
}

/* The largest of row[0..n) and at least from, and the exponentials row[j] =
** exp(row[j] - mx) with their sum. Each keeps ATT_LANES partial results, one per
** lane, so that the compiler turns the reductions into vector ops (a single
** running max or sum is a chain of dependent scalar steps: without reassociation
** it cannot be vectorised, and it cost more than the block's GEMMs). */
#ifndef ATT_LANES
#define ATT_LANES 8
#endif
static inline T FN(att_row_max)(const T *row, int64_t n, T from) {
  T part[ATT_LANES];
  for (int t = 0; t < ATT_LANES; t++) part[t] = from;
  int64_t j = 0;
  for (; j + ATT_LANES <= n; j += ATT_LANES)
    for (int t = 0; t < ATT_LANES; t++) part[t] = row[j + t] > part[t] ? row[j + t] : part[t];
  for (; j < n; j++) part[0] = row[j] > part[0] ? row[j] : part[0];
  T mx = part[0];
  for (int t = 1; t < ATT_LANES; t++) mx = part[t] > mx ? part[t] : mx;
  return mx;
}
static inline T FN(att_row_exp_sum)(T *row, int64_t n, T mx) {
  T part[ATT_LANES] = {0};
  int64_t j = 0;
  for (; j + ATT_LANES <= n; j += ATT_LANES)
    for (int t = 0; t < ATT_LANES; t++) {
      row[j + t] = EXP(row[j + t] - mx);
      part[t] += row[j + t];
    }
  for (; j < n; j++) { row[j] = EXP(row[j] - mx); part[0] += row[j]; }
  T sum = 0;
  for (int t = 0; t < ATT_LANES; t++) sum += part[t];
  return sum;
}

/* Forward over units (b, query block): the running max m, the running sum l and
** the unnormalised output rescaled as the max grows (an online softmax). */
static void FN(att_forward_range)(void *ctx, int64_t begin, int64_t end) {
  const FN(att_args) *a = ctx;
  T *s = malloc(sizeof(T) * QB * KB), *m = malloc(sizeof(T) * QB), *l = malloc(sizeof(T) * QB);
  if (!s || !m || !l) {
    free(s); free(m); free(l);
    __atomic_store_n(&((FN(att_args) *)a)->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int64_t u = begin; u < end; u++) {
    int64_t b = u / a->qblocks, i0 = (u % a->qblocks) * QB;
    int64_t nq = a->L - i0 < QB ? a->L - i0 : QB;
    T *o = a->o + (b * a->L + i0) * a->Ev;
    memset(o, 0, sizeof(T) * nq * a->Ev);
    for (int64_t i = 0; i < nq; i++) { m[i] = -(T)INFINITY; l[i] = 0; }
    int64_t nkb = FN(att_kblocks_for)(a, i0, nq);
    for (int64_t kb = 0; kb < nkb; kb++) {
      int64_t j0 = kb * KB, nk = a->S - j0 < KB ? a->S - j0 : KB;
      FN(att_scores)(a, b, i0, nq, j0, nk, s);
      for (int64_t i = 0; i < nq; i++) {
        T *row = s + i * KB, mx = FN(att_row_max)(row, nk, m[i]);
        if (mx == -(T)INFINITY) {             /* nothing to attend yet in this row */
          for (int64_t j = 0; j < nk; j++) row[j] = 0;
          continue;
        }
        T corr = m[i] == -(T)INFINITY ? 0 : EXP(m[i] - mx);
        T sum = FN(att_row_exp_sum)(row, nk, mx);
        l[i] = l[i] * corr + sum;
        m[i] = mx;
        if (corr != 1) for (int64_t e = 0; e < a->Ev; e++) o[i * a->Ev + e] *= corr;
      }
      GEMM(nq, a->Ev, nk, s, KB, 1, a->v + (b * a->S + j0) * a->Ev, a->Ev, o, a->Ev, 1);
    }
    for (int64_t i = 0; i < nq; i++) {
      /* a row with every key masked gives zeros (and no gradient) */
      T inv = l[i] > 0 ? 1 / l[i] : 0;
      for (int64_t e = 0; e < a->Ev; e++) o[i * a->Ev + e] *= inv;
      a->lse[b * a->L + i0 + i] = l[i] > 0 ? m[i] + (T)log(l[i]) : (T)INFINITY;
    }
  }
  free(s); free(m); free(l);
}

/* The probabilities and dS = P * (dP - delta) * scale of one block, into p and ds
** (both nq x nk, row stride KB). */
static void FN(att_block_grads)(const FN(att_args) *a, int64_t b, int64_t i0, int64_t nq,
                                int64_t j0, int64_t nk, T *p, T *ds) {
  FN(att_scores)(a, b, i0, nq, j0, nk, p);
  for (int64_t i = 0; i < nq; i++) {
    T lse = a->lse[b * a->L + i0 + i], *row = p + i * KB;
    for (int64_t j = 0; j < nk; j++) row[j] = EXP(row[j] - lse);
  }
  GEMM(nq, nk, a->Ev, a->dout + (b * a->L + i0) * a->Ev, a->Ev, 1,
       a->vt + b * a->Ev * a->S + j0, a->S, ds, KB, 0);
  for (int64_t i = 0; i < nq; i++) {
    T d = a->delta[b * a->L + i0 + i], *prow = p + i * KB, *drow = ds + i * KB;
    for (int64_t j = 0; j < nk; j++) drow[j] = prow[j] * (drow[j] - d) * a->scale;
  }
}

/* dK and dV over units (b, key block): every query block that sees the keys. */
static void FN(att_backward_kv_range)(void *ctx, int64_t begin, int64_t end) {
  const FN(att_args) *a = ctx;
  T *p = malloc(sizeof(T) * QB * KB), *ds = malloc(sizeof(T) * QB * KB);
  if (!p || !ds) {
    free(p); free(ds);
    __atomic_store_n(&((FN(att_args) *)a)->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int64_t u = begin; u < end; u++) {
    int64_t b = u / a->kblocks, j0 = (u % a->kblocks) * KB;
    int64_t nk = a->S - j0 < KB ? a->S - j0 : KB;
    T *dk = a->dk + (b * a->S + j0) * a->E, *dv = a->dv + (b * a->S + j0) * a->Ev;
    memset(dk, 0, sizeof(T) * nk * a->E);
    memset(dv, 0, sizeof(T) * nk * a->Ev);
    int64_t qb0 = a->causal ? j0 / QB : 0;
    for (int64_t qb = qb0; qb < a->qblocks; qb++) {
      int64_t i0 = qb * QB, nq = a->L - i0 < QB ? a->L - i0 : QB;
      FN(att_block_grads)(a, b, i0, nq, j0, nk, p, ds);
      GEMM(nk, a->Ev, nq, p, 1, KB, a->dout + (b * a->L + i0) * a->Ev, a->Ev, dv, a->Ev, 1);
      GEMM(nk, a->E, nq, ds, 1, KB, a->q + (b * a->L + i0) * a->E, a->E, dk, a->E, 1);
    }
  }
  free(p); free(ds);
}

/* dQ over units (b, query block). */
static void FN(att_backward_q_range)(void *ctx, int64_t begin, int64_t end) {
  const FN(att_args) *a = ctx;
  T *p = malloc(sizeof(T) * QB * KB), *ds = malloc(sizeof(T) * QB * KB);
  if (!p || !ds) {
    free(p); free(ds);
    __atomic_store_n(&((FN(att_args) *)a)->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int64_t u = begin; u < end; u++) {
    int64_t b = u / a->qblocks, i0 = (u % a->qblocks) * QB;
    int64_t nq = a->L - i0 < QB ? a->L - i0 : QB;
    T *dq = a->dq + (b * a->L + i0) * a->E;
    memset(dq, 0, sizeof(T) * nq * a->E);
    int64_t nkb = FN(att_kblocks_for)(a, i0, nq);
    for (int64_t kb = 0; kb < nkb; kb++) {
      int64_t j0 = kb * KB, nk = a->S - j0 < KB ? a->S - j0 : KB;
      FN(att_block_grads)(a, b, i0, nq, j0, nk, p, ds);
      GEMM(nq, a->E, nk, ds, KB, 1, a->k + (b * a->S + j0) * a->E, a->E, dq, a->E, 1);
    }
  }
  free(p); free(ds);
}

/* dQ, dK and dV in one pass over units b (a whole batch entry each): every block's
** scores are recomputed once, where the two passes above recompute them twice;
** used when there are batch entries enough to keep every thread busy. */
static void FN(att_backward_one_pass_range)(void *ctx, int64_t begin, int64_t end) {
  const FN(att_args) *a = ctx;
  T *p = malloc(sizeof(T) * QB * KB), *ds = malloc(sizeof(T) * QB * KB);
  if (!p || !ds) {
    free(p); free(ds);
    __atomic_store_n(&((FN(att_args) *)a)->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int64_t b = begin; b < end; b++) {
    memset(a->dq + b * a->L * a->E, 0, sizeof(T) * a->L * a->E);
    memset(a->dk + b * a->S * a->E, 0, sizeof(T) * a->S * a->E);
    memset(a->dv + b * a->S * a->Ev, 0, sizeof(T) * a->S * a->Ev);
    for (int64_t kb = 0; kb < a->kblocks; kb++) {
      int64_t j0 = kb * KB, nk = a->S - j0 < KB ? a->S - j0 : KB;
      T *dk = a->dk + (b * a->S + j0) * a->E, *dv = a->dv + (b * a->S + j0) * a->Ev;
      const T *kk = a->k + (b * a->S + j0) * a->E;
      for (int64_t qb = a->causal ? j0 / QB : 0; qb < a->qblocks; qb++) {
        int64_t i0 = qb * QB, nq = a->L - i0 < QB ? a->L - i0 : QB;
        FN(att_block_grads)(a, b, i0, nq, j0, nk, p, ds);
        GEMM(nk, a->Ev, nq, p, 1, KB, a->dout + (b * a->L + i0) * a->Ev, a->Ev, dv, a->Ev, 1);
        GEMM(nk, a->E, nq, ds, 1, KB, a->q + (b * a->L + i0) * a->E, a->E, dk, a->E, 1);
        GEMM(nq, a->E, nk, ds, KB, 1, kk, a->E, a->dq + (b * a->L + i0) * a->E, a->E, 1);
      }
    }
  }
  free(p); free(ds);
}

/* Transposes each batch's (n x c) matrix into (c x n). */
static void FN(att_transpose)(const T *x, T *xt, int64_t B, int64_t n, int64_t c) {
  for (int64_t b = 0; b < B; b++) {
    const T *src = x + b * n * c;
    T *dst = xt + b * n * c;
    /* in 16 x 16 tiles: a row at a time, the writes go n elements apart and each
    ** lands on its own cache line */
    for (int64_t i0 = 0; i0 < n; i0 += 16)
      for (int64_t j0 = 0; j0 < c; j0 += 16) {
        int64_t i1 = i0 + 16 < n ? i0 + 16 : n, j1 = j0 + 16 < c ? j0 + 16 : c;
        for (int64_t j = j0; j < j1; j++)
          for (int64_t i = i0; i < i1; i++) dst[j * n + i] = src[i * c + j];
      }
  }
}

static void FN(att_init)(FN(att_args) *a, int64_t B, int64_t L, int64_t S, int64_t E,
                         int64_t Ev, const T *q, const T *k, const T *v, const T *mask,
                         const int64_t *ms, int causal, double scale) {
  memset(a, 0, sizeof *a);
  a->B = B; a->L = L; a->S = S; a->E = E; a->Ev = Ev;
  a->qblocks = (L + QB - 1) / QB; a->kblocks = (S + KB - 1) / KB;
  a->q = q; a->k = k; a->v = v; a->mask = mask;
  if (mask) {
    a->minner = ms[0] > 0 ? ms[0] : 1;
    a->mso = ms[1]; a->msi = ms[2]; a->msl = ms[3]; a->mss = ms[4];
  }
  a->causal = causal; a->scale = (T)scale;
}

/* out and lse from q, k, v; false when memory ran out. */
static bool FN(att_forward)(em_state *St, int64_t B, int64_t L, int64_t S, int64_t E,
                            int64_t Ev, const T *q, const T *k, const T *v, const T *mask,
                            const int64_t *ms, int causal, double scale, T *out, T *lse) {
  FN(att_args) a;
  FN(att_init)(&a, B, L, S, E, Ev, q, k, v, mask, ms, causal, scale);
  T *kt = malloc(sizeof(T) * (size_t)(B * S * E + 1));
  if (!kt) return false;
  FN(att_transpose)(k, kt, B, S, E);
  a.kt = kt; a.o = out; a.lse = lse;
  emi_parallel_for(St, B * a.qblocks, 1, FN(att_forward_range), &a);
  free(kt);
  return !a.failed;
}

/* dq, dk, dv from the forward's out and lse and the output's gradient dout. */
static bool FN(att_backward)(em_state *St, int64_t B, int64_t L, int64_t S, int64_t E,
                             int64_t Ev, const T *q, const T *k, const T *v, const T *mask,
                             const int64_t *ms, int causal, double scale, const T *out,
                             const T *lse, const T *dout, T *dq, T *dk, T *dv) {
  FN(att_args) a;
  FN(att_init)(&a, B, L, S, E, Ev, q, k, v, mask, ms, causal, scale);
  T *kt = malloc(sizeof(T) * (size_t)(B * S * E + 1));
  T *vt = malloc(sizeof(T) * (size_t)(B * S * Ev + 1));
  T *delta = malloc(sizeof(T) * (size_t)(B * L + 1));
  if (!kt || !vt || !delta) { free(kt); free(vt); free(delta); return false; }
  FN(att_transpose)(k, kt, B, S, E);
  FN(att_transpose)(v, vt, B, S, Ev);
  for (int64_t r = 0; r < B * L; r++) {       /* delta = rowsum(dout * out) */
    T d = 0;
    for (int64_t e = 0; e < Ev; e++) d += dout[r * Ev + e] * out[r * Ev + e];
    delta[r] = d;
  }
  a.kt = kt; a.vt = vt; a.out = out; a.dout = dout; a.delta = delta;
  a.lse = (T *)lse; a.dq = dq; a.dk = dk; a.dv = dv;
  if (B >= 2 * emi_workers_size(St->workers)) {
    emi_parallel_for(St, B, 1, FN(att_backward_one_pass_range), &a);
  } else {
    emi_parallel_for(St, B * a.kblocks, 1, FN(att_backward_kv_range), &a);
    emi_parallel_for(St, B * a.qblocks, 1, FN(att_backward_q_range), &a);
  }
  free(kt); free(vt); free(delta);
  return !a.failed;
}

#undef FN
#undef CAT
#undef CAT_
