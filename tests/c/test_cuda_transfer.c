/*
** test_cuda_transfer.c -- moving data between the host and the devices and
** between devices, on the emulated runtime (two devices of 64 MB):
**   - copies from cuda:0 to cuda:1 for every dtype, from strided sources, into
**     strided and other-dtype destinations, queued behind work on the source
**     device and read back without explicit syncs;
**   - a source that dies right after its copy was queued, whose memory the
**     source device reuses at once: the copy still reads the old values;
**   - pinned host tensors: pin_memory, is_pinned, the asynchronous copy on the
**     copy stream (no pageable copy is counted, no staging), a destination
**     freed and reused while the copy stream still writes, and errors;
**   - memory pressure: the flag the allocator raises past 80 % and at
**     out-of-memory, and an embedder's reclaim hook that frees memory so the
**     failing allocation is retried and succeeds;
**   - every device allocation of these paths failing in turn, with no leak.
*/
#include "cuda_check.h"
#include "internal.h"
#include "../../kernels/cuda.h"

static em_dtype ALL[] = {EM_BOOL, EM_UINT8, EM_INT32, EM_INT64, EM_FLOAT16, EM_BFLOAT16,
                         EM_FLOAT32, EM_FLOAT64};

/* (rows, cols) of values that every dtype holds exactly */
static em_status host_values(em_state *S, em_dtype dt, int64_t rows, int64_t cols,
                             em_tensor **out) {
  int64_t n = rows * cols;
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    v[i] = dt == EM_BOOL ? (double)(i % 3 == 0) : dt == EM_UINT8 ? (double)(i % 251)
                                                                  : (double)(i % 200 - 50);
  em_status st = t_make(S, out, dt, (int64_t[]){rows, cols}, 2, v, n);
  free(v);
  return st;
}

static int same_values(const em_tensor *a, const em_tensor *b) {
  if (em_tensor_numel(a) != em_tensor_numel(b)) return 0;
  for (int64_t i = 0; i < em_tensor_numel(a); i++)
    if (t_get(a, i) != t_get(b, i)) return 0;
  return 1;
}

/* a (contiguous CPU copy of) t */
static em_tensor *on_cpu(em_state *S, const em_tensor *t) {
  em_tensor *r = NULL, *c = NULL;
  if (em_to(S, t, em_tensor_dtype(t), EM_CPU, &r)) return NULL;
  if (em_contiguous(S, r, &c)) { em_tensor_release(r); return NULL; }
  em_tensor_release(r);
  return c;
}

static void test_peer_copies(em_state *S) {
  for (size_t k = 0; k < sizeof ALL / sizeof *ALL; k++) {
    em_dtype dt = ALL[k];
    em_tensor *h, *d0, *d1, *ht, *d0t, *d1t, *b1, *b1t;
    REQUIRE_OK(S, host_values(S, dt, 37, 45, &h));
    REQUIRE_OK(S, em_to(S, h, dt, 0, &d0));
    REQUIRE_OK(S, em_to(S, d0, dt, 1, &d1));               /* contiguous */
    CHECK(em_tensor_device(d1) == 1, "on cuda:1");
    b1 = on_cpu(S, d1);
    CHECK(b1 && same_values(h, b1), "%s: cuda:0 -> cuda:1", em_dtype_name(dt));
    REQUIRE_OK(S, em_transpose(S, h, 0, 1, &ht));
    REQUIRE_OK(S, em_transpose(S, d0, 0, 1, &d0t));
    REQUIRE_OK(S, em_to(S, d0t, dt, 1, &d1t));            /* strided source */
    b1t = on_cpu(S, d1t);
    em_tensor *htc = NULL;
    REQUIRE_OK(S, em_contiguous(S, ht, &htc));
    CHECK(b1t && same_values(htc, b1t), "%s: transposed source", em_dtype_name(dt));
    em_tensor_release(h); em_tensor_release(d0); em_tensor_release(d1);
    em_tensor_release(ht); em_tensor_release(d0t); em_tensor_release(d1t);
    em_tensor_release(b1); em_tensor_release(b1t); em_tensor_release(htc);
  }
}

static void test_peer_conversions_and_views(em_state *S) {
  em_tensor *h, *d0, *d1, *b, *hd;
  REQUIRE_OK(S, host_values(S, EM_INT32, 20, 30, &h));
  REQUIRE_OK(S, em_to(S, h, EM_INT32, 0, &d0));
  REQUIRE_OK(S, em_to(S, d0, EM_FLOAT64, 1, &d1));         /* dtype changes on the way */
  CHECK(em_tensor_dtype(d1) == EM_FLOAT64 && em_tensor_device(d1) == 1, "float64 on cuda:1");
  REQUIRE_OK(S, em_to(S, h, EM_FLOAT64, EM_CPU, &hd));
  b = on_cpu(S, d1);
  CHECK(b && same_values(hd, b), "int32 cuda:0 -> float64 cuda:1");
  em_tensor_release(b);
  /* into a strided window of a tensor on cuda:1 (copy_) */
  em_tensor *z, *win, *src, *srcd;
  REQUIRE_OK(S, em_full(S, (int64_t[]){20, 30}, 2, 0.0, EM_FLOAT64, 1, &z));
  REQUIRE_OK(S, em_narrow(S, z, 1, 5, 10, &win));
  REQUIRE_OK(S, em_narrow(S, d1, 1, 0, 10, &src));
  REQUIRE_OK(S, em_to(S, src, EM_FLOAT64, 0, &srcd));       /* a copy on cuda:0 */
  REQUIRE_OK(S, em_copy_(S, win, srcd));
  b = on_cpu(S, z);
  int ok = b != NULL;
  for (int64_t r = 0; ok && r < 20; r++)
    for (int64_t c = 0; c < 30; c++) {
      double want = c >= 5 && c < 15 ? t_get(hd, r * 30 + (c - 5)) : 0;
      if (t_get(b, r * 30 + c) != want) { ok = 0; break; }
    }
  CHECK(ok, "a window of cuda:1 filled from cuda:0; the rest untouched");
  em_tensor_release(b); em_tensor_release(z); em_tensor_release(win);
  em_tensor_release(src); em_tensor_release(srcd);
  em_tensor_release(h); em_tensor_release(d0); em_tensor_release(d1); em_tensor_release(hd);
}

/* The source of a peer copy dies as soon as the copy is queued, and cuda:0
** hands its memory to the next tensor at once, which a kernel overwrites: the
** copy must have read the old values (cuda:0's stream waited for it). Repeated
** so a race would show. */
static void test_peer_source_reuse(em_state *S) {
  int ok = 1;
  for (int round = 0; round < 20 && ok; round++) {
    em_tensor *a, *b, *c, *back;
    REQUIRE_OK(S, em_full(S, (int64_t[]){50000}, 1, 1.0 + round, EM_FLOAT32, 0, &a));
    REQUIRE_OK(S, em_to(S, a, EM_FLOAT32, 1, &b));
    em_tensor_release(a);
    REQUIRE_OK(S, em_full(S, (int64_t[]){50000}, 1, -7.0, EM_FLOAT32, 0, &c));
    REQUIRE_OK(S, em_to(S, b, EM_FLOAT32, EM_CPU, &back));
    for (int64_t i = 0; i < 50000; i += 997)
      if (t_get(back, i) != 1.0 + round) { ok = 0; break; }
    em_tensor_release(b); em_tensor_release(c); em_tensor_release(back);
  }
  CHECK(ok, "the copy read its source before cuda:0 reused the memory");
}

static void test_pinned(em_state *S) {
  emk_runtime *rt = emk_ctx(S)->rt;
  em_tensor *h, *p, *p2, *d, *back;
  REQUIRE_OK(S, host_values(S, EM_FLOAT32, 64, 100, &h));
  CHECK(!em_tensor_is_pinned(h), "ordinary memory is not pinned");
  REQUIRE_OK(S, em_tensor_pin_memory(S, h, &p));
  CHECK(em_tensor_is_pinned(p) && em_tensor_device(p) == EM_CPU, "pinned, on the cpu");
  CHECK(same_values(h, p), "pin_memory copies the values");
  REQUIRE_OK(S, em_tensor_pin_memory(S, p, &p2));
  CHECK(p2 == p, "pinning a pinned tensor gives it back");
  em_tensor_release(p2);
  size_t pageable = emk_emu_pageable_copies(rt);
  em_cuda_memory m0, m1;
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m0));
  REQUIRE_OK(S, em_to(S, p, EM_FLOAT32, 0, &d));
  CHECK(emk_emu_pageable_copies(rt) == pageable, "the copy read pinned memory directly");
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m1));
  CHECK(m1.allocated == m0.allocated + 25600, "one 25,600-byte block for the result "
        "(the one allocated first went back): %lld", (long long)(m1.allocated - m0.allocated));
  /* compute on it right away: the compute stream waits for the copy stream */
  em_tensor *twice;
  REQUIRE_OK(S, em_binary(S, EM_ADD, d, d, &twice));
  back = on_cpu(S, twice);
  int ok = back != NULL;
  for (int64_t i = 0; ok && i < 6400; i++) ok = t_get(back, i) == 2 * t_get(h, i);
  CHECK(ok, "d + d after an asynchronous copy");
  em_tensor_release(back); em_tensor_release(twice);
  /* the destination dies while more copies are queued: its block is reused
  ** only after the compute stream's work on it ran */
  ok = 1;
  for (int round = 0; round < 10 && ok; round++) {
    em_tensor *x, *y, *yb;
    REQUIRE_OK(S, em_to(S, p, EM_FLOAT32, 0, &x));
    REQUIRE_OK(S, em_binary_scalar(S, EM_MUL, x, 3.0, 0, &y));
    em_tensor_release(x);
    yb = on_cpu(S, y);
    for (int64_t i = 0; yb && i < 6400; i += 61)
      if (t_get(yb, i) != 3 * t_get(h, i)) { ok = 0; break; }
    em_tensor_release(y); em_tensor_release(yb);
  }
  CHECK(ok, "copies and compute in rounds");
  /* pinned into a strided view and another dtype: still right */
  em_tensor *pt, *dt64, *b64, *hT, *hTc;
  REQUIRE_OK(S, em_transpose(S, p, 0, 1, &pt));
  REQUIRE_OK(S, em_to(S, pt, EM_FLOAT64, 1, &dt64));
  REQUIRE_OK(S, em_transpose(S, h, 0, 1, &hT));
  REQUIRE_OK(S, em_contiguous(S, hT, &hTc));
  b64 = on_cpu(S, dt64);
  CHECK(b64 && same_values(hTc, b64), "a transposed pinned tensor to float64 on cuda:1");
  em_tensor_release(pt); em_tensor_release(dt64); em_tensor_release(b64);
  em_tensor_release(hT); em_tensor_release(hTc);
  /* the pinned source is released while its copy may still be queued */
  em_tensor *q, *dq, *bq;
  REQUIRE_OK(S, em_tensor_pin_memory(S, h, &q));
  REQUIRE_OK(S, em_to(S, q, EM_FLOAT32, 0, &dq));
  em_tensor_release(q);
  bq = on_cpu(S, dq);
  CHECK(bq && same_values(h, bq), "the copy kept its pinned source alive");
  em_tensor_release(dq); em_tensor_release(bq);
  /* errors */
  em_tensor *bad;
  CHECK_ERR(S, em_tensor_pin_memory(S, d, &bad), EM_ERR_DEVICE, "pin_memory", "cuda:0");
  em_tensor_release(d); em_tensor_release(p); em_tensor_release(h);
  REQUIRE_OK(S, em_cuda_synchronize(S, -1));   /* gives dead pinned blocks back */
  CHECK(emk_emu_live_blocks(rt, -1) == 0, "no pinned memory left: %zu blocks",
        emk_emu_live_blocks(rt, -1));
}

typedef struct { em_tensor *held; int calls; } reclaim_ctx;
static void reclaim(void *ud, int device, size_t nbytes) {
  reclaim_ctx *r = ud;
  (void)device; (void)nbytes;
  r->calls++;
  em_tensor_release(r->held);
  r->held = NULL;
}

static void test_pressure_and_reclaim(em_state *S) {
  int *flag = em_memory_pressure_flag(S);
  *flag = 0;
  REQUIRE_OK(S, em_cuda_empty_cache(S, -1));
  em_tensor *a, *b;
  REQUIRE_OK(S, em_empty(S, (int64_t[]){30 << 20}, 1, EM_UINT8, 1, &a));
  CHECK(*flag == 0, "47 %% of cuda:1: no pressure");
  REQUIRE_OK(S, em_empty(S, (int64_t[]){24 << 20}, 1, EM_UINT8, 1, &b));
  CHECK(*flag == 1, "84 %% of cuda:1: pressure");
  *flag = 0;
  em_tensor_release(b);
  /* 40 MB more can't fit beside a's 30: the hook releases a, the retry fits */
  reclaim_ctx r = {a, 0};
  em_cuda_set_reclaim_hook(S, reclaim, &r);
  em_tensor *c = NULL;
  REQUIRE_OK(S, em_empty(S, (int64_t[]){40 << 20}, 1, EM_UINT8, 1, &c));
  CHECK(r.calls == 1 && r.held == NULL, "the hook ran once: %d", r.calls);
  CHECK(*flag == 1, "and the flag was raised for Lua");
  em_tensor_release(c);
  /* without anything to free, the error names the device and the sizes */
  em_cuda_set_reclaim_hook(S, NULL, NULL);
  CHECK_ERR(S, em_empty(S, (int64_t[]){80 << 20}, 1, EM_UINT8, 1, &c), EM_ERR_NOMEM,
            "cuda:1", "80.00 MiB", "capacity", "[83886080]");
  *flag = 0;
}

/* Every device allocation of a pinned copy and a strided, converting peer copy
** made to fail in turn: the allocator's retry absorbs it or the call fails
** with a clear error, the values are right whenever the calls succeed, and
** nothing is left allocated. */
static void test_injected_failures(em_state *S) {
  emk_runtime *rt = emk_ctx(S)->rt;
  em_tensor *h, *p;
  REQUIRE_OK(S, host_values(S, EM_INT32, 30, 40, &h));
  REQUIRE_OK(S, em_tensor_pin_memory(S, h, &p));
  em_cuda_memory m0[2];
  REQUIRE_OK(S, em_cuda_empty_cache(S, -1));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m0[0]));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 1, &m0[1]));
  int failures = 0, right = 1, clear = 1;
  for (int k = 1; k <= 8; k++) {
    REQUIRE_OK(S, em_cuda_empty_cache(S, -1));
    emk_emu_fail_nth_malloc(rt, k);
    em_tensor *d0 = NULL, *t = NULL, *d1 = NULL, *back = NULL;
    em_status st = em_to(S, p, EM_INT32, 0, &d0);
    if (!st) st = em_transpose(S, d0, 0, 1, &t);
    if (!st) st = em_to(S, t, EM_FLOAT64, 1, &d1);
    emk_emu_fail_nth_malloc(rt, 0);
    if (st) {
      failures++;
      if (st != EM_ERR_NOMEM || !strstr(em_errmsg(S), "out of memory")) {
        clear = 0;
        printf("  injected failure %d: status %d: %s\n", k, (int)st, em_errmsg(S));
      }
    } else if ((back = on_cpu(S, d1))) {
      for (int64_t r = 0; r < 40; r++)
        for (int64_t c = 0; c < 30; c++)
          if (t_get(back, r * 30 + c) != t_get(h, c * 40 + r)) right = 0;
    }
    em_tensor_release(d0); em_tensor_release(t); em_tensor_release(d1);
    em_tensor_release(back);
  }
  em_cuda_memory m1[2];
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m1[0]));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 1, &m1[1]));
  /* a single refusal is absorbed: the allocator empties its cache and asks again */
  int64_t retries = m1[0].oom_retries - m0[0].oom_retries + m1[1].oom_retries -
                    m0[1].oom_retries;
  CHECK(retries + failures >= 2, "the injected failures were met: %lld retries, %d calls "
        "failed", (long long)retries, failures);
  CHECK(clear, "each failure was an out-of-memory error");
  CHECK(right, "the values were right whenever the calls succeeded");
  REQUIRE_OK(S, em_cuda_synchronize(S, -1));
  REQUIRE_OK(S, em_cuda_empty_cache(S, -1));
  for (int dev = 0; dev < 2; dev++) {
    em_cuda_memory m;
    REQUIRE_OK(S, em_cuda_memory_stats(S, dev, &m));
    CHECK(m.allocated == m0[dev].allocated && m.reserved == 0,
          "cuda:%d: nothing left: %lld allocated, %lld reserved", dev,
          (long long)m.allocated, (long long)m.reserved);
    CHECK(emk_emu_live_blocks(rt, dev) == 0, "cuda:%d: no live runtime blocks", dev);
  }
  em_tensor_release(p); em_tensor_release(h);
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "2:64")) return 1;
  if (em_cuda_device_count(S) < 2) {
    char why[64];
    snprintf(why, sizeof why, "needs two devices (%d here)", em_cuda_device_count(S));
    em_close(S);
    return check_skip_all(why);
  }
  RUN(test_peer_copies, S);
  RUN(test_peer_conversions_and_views, S);
  RUN(test_peer_source_reuse, S);
  if (em_cuda_emulated(S)) RUN(test_pinned, S);
  else check_skip("test_pinned reads the emulator's counters");
  RUN(test_pressure_and_reclaim, S);
  if (em_cuda_emulated(S)) RUN(test_injected_failures, S);
  else check_skip("test_injected_failures injects faults into the emulator");
  em_close(S);
  return check_done();
}
