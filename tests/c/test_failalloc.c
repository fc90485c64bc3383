/*
** test_failalloc.c -- every allocation failure is reported, and leaks nothing.
**
** The state's allocator hook (em_config.alloc) is replaced by one that refuses
** the Nth request and counts the bytes and blocks it has handed out. For N = 1,
** 2, ... a fixed sequence of representative calls (opening the state, creation,
** broadcasting with promotion, reductions, matmul, joins, indexing, views, a
** reshape that copies, conversions, in-place ops, random fills, big ops that use
** the worker threads) runs until the refusal comes; then everything is released and
** the state closed. Each such run must:
**   - stop with EM_ERR_NOMEM and a message (never crash, never abort);
**   - leave an in-place op's input as it was when that op is the one refused;
**   - raise the memory pressure flag (em_memory_pressure_flag), so a host collects
**     its garbage and retries;
**   - give every byte back (live bytes and blocks both return to zero);
**   - free each block with the size it was allocated with (lua_Alloc contract).
** The loop ends with the first N whose run completes without reaching the
** refusal; its results must match those of an unhindered run. Under
** AddressSanitizer (make test SANITIZE=1) this also proves no use-after-free or
** double free on any error path.
*/
#include "check.h"
#include "failalloc.h"

/* -- The sequence ---------------------------------------------------------------------- */

typedef struct run_result {
  em_status status;        /* EM_OK when the whole sequence ran */
  const char *step;        /* the call that failed */
  char msg[512];
  int input_changed;       /* a refused in-place op modified its input */
  int pressure;            /* the memory pressure flag after the failure */
  double checksum;         /* of the results, for a completed run */
} run_result;

enum { NT = 80 };

static double sum_all(const em_tensor *t) {
  double s = 0;
  for (int64_t i = 0; t && i < em_tensor_numel(t); i++) s += t_get(t, i);
  return s;
}

/* STEP runs one call; on failure it records it and jumps to the cleanup.
** INPLACE additionally snapshots `target` first and compares after a failure. */
#define STEP(call) do { \
    r->step = #call; \
    em_status st_ = (call); \
    if (st_ != EM_OK) { r->status = st_; goto fail; } \
  } while (0)
#define INPLACE(target, call) do { \
    snap_n = em_tensor_numel(target) < 64 ? em_tensor_numel(target) : 64; \
    for (int64_t q_ = 0; q_ < snap_n; q_++) snap[q_] = t_get(target, q_); \
    snap_t = (target); \
    STEP(call); \
    snap_t = NULL; \
  } while (0)

static void run_sequence(fa_state *f, run_result *r) {
  em_state *S = NULL;
  em_tensor *t[NT] = {0};
  double snap[64];
  int64_t snap_n = 0;
  em_tensor *snap_t = NULL;
  em_config cfg;
  em_config_init(&cfg);
  cfg.alloc = fa_alloc;
  cfg.alloc_ud = f;
  cfg.num_threads = 2;
  cfg.seed = 5;
  memset(r, 0, sizeof *r);
  static const double bi[4] = {1, 2, 3, 4}, ii[3] = {2, 0, 1}, gi[6] = {0, 3, 1, 1, 2, 0};
  static const int d0[1] = {0}, d1[1] = {1}, perm[3] = {2, 0, 1};

  STEP(em_open(&S, &cfg));
  /* creation, views */
  STEP(em_arange(S, 0, 12, 1, EM_FLOAT32, EM_CPU, &t[0]));
  STEP(em_view(S, t[0], SHP(3, 4), &t[1]));                        /* a [3,4] */
  STEP(em_from_data(S, SHP(4), EM_INT32, bi, EM_FLOAT64, &t[2]));  /* b [4] int32 */
  STEP(em_full(S, SHP(3, 1), 2.0, EM_FLOAT64, EM_CPU, &t[3]));
  STEP(em_transpose(S, t[1], 0, 1, &t[4]));                        /* a^T [4,3] */
  STEP(em_eye(S, 4, 3, EM_FLOAT32, EM_CPU, &t[5]));
  STEP(em_expand(S, t[2], SHP(3, 4), &t[6]));
  STEP(em_unsqueeze(S, t[1], 0, &t[7]));
  STEP(em_permute(S, t[7], perm, 3, &t[8]));
  STEP(em_select(S, t[1], 1, 2, &t[9]));
  STEP(em_narrow(S, t[4], 0, 1, 2, &t[10]));                       /* [2,3] strided */
  STEP(em_squeeze(S, t[7], 0, 0, &t[11]));
  STEP(em_empty(S, SHP(2, 3, 4), EM_FLOAT32, EM_CPU, &t[12]));
  STEP(em_fill_(S, t[12], 0.5));
  /* element-wise: broadcasting, promotion, scalars, strided inputs */
  STEP(em_binary(S, EM_ADD, t[1], t[2], &t[13]));                  /* f32 + i32 bcast */
  STEP(em_binary(S, EM_MUL, t[13], t[3], &t[14]));                 /* -> f64 */
  STEP(em_binary_scalar(S, EM_SUB, t[14], 1, 1, &t[15]));
  STEP(em_unary(S, EM_EXP, t[10], &t[16]));
  STEP(em_unary(S, EM_SIGMOID, t[4], &t[17]));
  STEP(em_binary(S, EM_MAXIMUM, t[6], t[1], &t[18]));
  STEP(em_binary_scalar(S, EM_GT, t[1], 5, 0, &t[19]));
  STEP(em_where(S, t[19], t[1], t[14], &t[20]));
  STEP(em_clamp(S, t[14], 2, 10, &t[21]));
  STEP(em_add_scaled(S, t[1], t[6], 0.5, &t[22]));
  STEP(em_binary(S, EM_DIV, t[2], t[2], &t[23]));                  /* int / int -> f32 */
  STEP(em_binary(S, EM_ADD, t[12], t[11], &t[24]));                /* [2,3,4] + [3,4] */
  STEP(em_binary(S, EM_SUB, t[8], t[4], &t[65]));                  /* [4,1,3] - [4,3] */
  /* reductions */
  STEP(em_reduce(S, EM_SUM, t[14], d1, 1, 1, &t[25]));
  STEP(em_reduce(S, EM_MEAN, t[17], NULL, 0, 0, &t[26]));
  STEP(em_var(S, t[14], d0, 1, 1, 0, 1, &t[27]));
  STEP(em_norm(S, t[4], 2, NULL, 0, 0, &t[28]));
  STEP(em_max_dim(S, t[17], 1, 0, 1, &t[29], &t[30]));
  STEP(em_min_dim(S, t[4], 0, 1, 0, &t[31], &t[32]));
  STEP(em_argmax(S, t[14], 0, 1, 0, 1, &t[33]));
  STEP(em_softmax(S, t[4], 1, 0, &t[34]));
  STEP(em_softmax(S, t[10], 0, 1, &t[35]));
  STEP(em_reduce(S, EM_LOGSUMEXP, t[4], d0, 1, 0, &t[36]));
  STEP(em_reduce(S, EM_PROD, t[2], NULL, 0, 0, &t[37]));
  /* linear algebra */
  STEP(em_matmul(S, t[1], t[4], &t[38]));                          /* [3,4]@[4,3] */
  STEP(em_arange(S, 0, 24, 1, EM_FLOAT32, EM_CPU, &t[39]));
  STEP(em_view(S, t[39], SHP(2, 3, 4), &t[40]));
  STEP(em_matmul(S, t[40], t[5], &t[41]));                         /* batched bcast */
  STEP(em_to(S, t[2], EM_FLOAT32, EM_CPU, &t[42]));
  STEP(em_matmul(S, t[1], t[42], &t[43]));                         /* matrix @ vector */
  /* joining and indexing */
  em_tensor *list[3];
  STEP(em_transpose(S, t[17], 0, 1, &t[44]));                      /* [3,4] strided */
  list[0] = t[1]; list[1] = t[13]; list[2] = t[44];
  STEP(em_cat(S, list, 3, 0, &t[45]));
  STEP(em_stack(S, list, 3, 1, &t[46]));
  STEP(em_from_data(S, SHP(3), EM_INT64, ii, EM_FLOAT64, &t[47]));
  STEP(em_index_select(S, t[45], 0, t[47], 0, &t[48]));
  STEP(em_from_data(S, SHP(3, 2), EM_INT64, gi, EM_FLOAT64, &t[49]));
  STEP(em_gather(S, t[1], 1, t[49], 0, &t[50]));
  STEP(em_one_hot(S, t[47], 0, 0, &t[51]));
  /* copies and conversions */
  STEP(em_reshape(S, t[4], SHP(12), &t[52]));                      /* copies */
  STEP(em_contiguous(S, t[10], &t[53]));
  STEP(em_clone(S, t[1], &t[54]));
  STEP(em_to(S, t[14], EM_FLOAT16, EM_CPU, &t[55]));
  STEP(em_to(S, t[4], EM_BFLOAT16, EM_CPU, &t[56]));
  STEP(em_copy_(S, t[54], t[55]));
  /* in-place ops: a refused one must leave its input alone */
  INPLACE(t[54], em_binary_(S, EM_ADD, t[54], t[14]));           /* f32 += f64 */
  INPLACE(t[54], em_add_scaled_(S, t[54], t[2], 0.5));           /* += i32 bcast */
  INPLACE(t[4], em_binary_scalar_(S, EM_MUL, t[4], 2));          /* strided view */
  INPLACE(t[10], em_unary_(S, EM_NEG, t[10]));
  INPLACE(t[54], em_clamp_(S, t[54], 0, 30));
  /* random fills */
  STEP(em_empty(S, SHP(100), EM_FLOAT32, EM_CPU, &t[57]));
  STEP(em_uniform_(S, t[57], -1, 1));
  STEP(em_normal_(S, t[57], 0, 1));
  STEP(em_empty(S, SHP(50), EM_INT64, EM_CPU, &t[58]));
  STEP(em_randint_(S, t[58], 0, 10));
  /* big enough for the worker threads */
  STEP(em_full(S, SHP(300, 1000), 1, EM_FLOAT32, EM_CPU, &t[59]));
  STEP(em_transpose(S, t[59], 0, 1, &t[60]));
  STEP(em_binary(S, EM_ADD, t[59], t[59], &t[61]));
  STEP(em_reduce(S, EM_SUM, t[60], d1, 1, 0, &t[62]));
  STEP(em_reduce(S, EM_SUM, t[61], NULL, 0, 0, &t[63]));
  STEP(em_uniform_(S, t[61], 0, 1));
  STEP(em_contiguous(S, t[60], &t[64]));
  /* worker threads restart: a refused start keeps the old ones */
  STEP(em_set_num_threads(S, 3));
  STEP(em_set_num_threads(S, 2));

  r->checksum = 0;
  for (int k = 0; k < NT; k++)
    if (t[k] && k != 12 && k != 61 && em_tensor_numel(t[k]) < 100000)
      r->checksum += sum_all(t[k]) * (k + 1);
  r->checksum += sum_all(t[62]) + sum_all(t[63]);
  goto release;

fail:
  snprintf(r->msg, sizeof r->msg, "%s", em_errmsg(S));
  r->pressure = S ? *em_memory_pressure_flag(S) : 1;
  if (snap_t)
    for (int64_t q = 0; q < snap_n; q++) {
      double v = t_get(snap_t, q);
      if (!(v == snap[q] || (isnan(v) && isnan(snap[q])))) r->input_changed = 1;
    }
release:
  for (int k = 0; k < NT; k++) em_tensor_release(t[k]);
  em_close(S);
}

int main(void) {
  fa_state f = FA_STATE_INIT;
  run_result r;

  chk_group_begin("unhindered run");
  run_sequence(&f, &r);
  long total = f.count;
  int ok = CHECK(r.status == EM_OK, "%s fails even without an injected failure (status %d: %s)",
                 r.step, (int)r.status, r.msg);
  CHECK(f.live_bytes == 0 && f.live_blocks == 0, "%lld bytes in %ld blocks still live",
        (long long)f.live_bytes, f.live_blocks);
  CHECK(f.bad_sizes == 0, "%ld frees passed the wrong size", f.bad_sizes);
  double want = r.checksum;
  printf("     (%ld allocations in the sequence)\n", total);

  chk_group_begin("failing allocation N = 1, 2, ...");
  int stuck = 0, reported = 0;
  long n;
  for (n = 1; ok && n < 20000; n++) {
    fa_reset(&f, n);
    run_sequence(&f, &r);
    if (!f.injected) {                    /* the run got past its last allocation */
      CHECK(r.status == EM_OK, "N=%ld: %s failed with no injected failure: %s", n, r.step,
            r.msg);
      CHECK(r.checksum == want, "N=%ld: results %.17g, want %.17g", n, r.checksum, want);
      break;
    }
    int good = 1;
    if (r.status == EM_OK) {
      /* The refusal was absorbed (a fallback path): allowed, results must hold. */
      good &= CHECK(r.checksum == want, "N=%ld: refusal absorbed but results differ", n);
    } else {
      good &= CHECK(r.status == EM_ERR_NOMEM, "N=%ld: %s returned status %d, want "
                    "EM_ERR_NOMEM (%s)", n, r.step, (int)r.status, r.msg);
      good &= CHECK(r.msg[0] != 0 || strstr(r.step, "em_open"),
                    "N=%ld: %s failed without a message", n, r.step);
      good &= CHECK(!r.input_changed, "N=%ld: refused %s modified its input", n, r.step);
      /* (the flag a host's collect-and-retry reads: the refused memory may be
      ** held by garbage it can free) */
      good &= CHECK(r.pressure, "N=%ld: %s refused without raising the pressure flag", n,
                    r.step);
    }
    good &= CHECK(f.live_bytes == 0 && f.live_blocks == 0,
                  "N=%ld: after %s failed, %lld bytes in %ld blocks leaked", n, r.step,
                  (long long)f.live_bytes, f.live_blocks);
    good &= CHECK(f.bad_sizes == 0, "N=%ld: %ld frees passed the wrong size (run stopped at "
                  "%s)", n, f.bad_sizes, r.status ? r.step : "the end");
    if (!good && ++reported >= 20) { stuck = 1; break; }  /* enough to go on with */
  }
  if (stuck) printf("     (stopped after 20 failing runs)\n");
  else if (ok) printf("     (%ld runs)\n", n);
  CHECK(n < 20000, "the sequence never completed");
  return check_done();
}
