/*
** test_grid_emu.c -- the grid emulator (kernels/emu/grid.c) running kernels
** written with kernels/device.h, defined here: indices, barriers and shared
** memory, warp operations, atomics, the errors a GPU would turn into hangs or
** races, launches from several threads, and a rough speed.
*/
#include "check.h"
#include "../../kernels/device.h"
#include "../../kernels/emu/grid.h"
#include <pthread.h>
#include <time.h>

static char err[EMK_ERRMSG_SIZE];

static emk_dim3 D3(unsigned x, unsigned y, unsigned z) { return (emk_dim3){x, y, z}; }
static emk_dim3 D1(unsigned x) { return (emk_dim3){x, 1, 1}; }

static em_status run(const emk_kernel *k, emk_dim3 g, emk_dim3 b, size_t dyn,
                     const void *args) {
  return emk_grid_run(k, g, b, dyn, args, err, sizeof err);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* -- Kernels: indices ------------------------------------------------------------- */
typedef struct { int64_t *id; unsigned *tag; } index_args;

/* id is (grid blocks * block threads,): each thread writes its global linear id
** at that id; tag packs the thread's and block's indices, to check each. */
#define INDEX_BODY                                                                  \
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);  \
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);       \
  int64_t g = (int64_t)b * (blockDim.x * blockDim.y * blockDim.z) + t;               \
  a.id[g] = g;                                                                       \
  a.tag[2 * g] = threadIdx.x | threadIdx.y << 10 | threadIdx.z << 20;                \
  a.tag[2 * g + 1] = blockIdx.x | blockIdx.y << 10 | blockIdx.z << 20;
EMK_KERNEL(k_index, index_args) { INDEX_BODY }
EMK_KERNEL_SYNC(k_index_fibers, index_args) { INDEX_BODY }

static int check_indices(const emk_kernel *k, emk_dim3 g, emk_dim3 b) {
  size_t bt = (size_t)b.x * b.y * b.z, n = (size_t)g.x * g.y * g.z * bt;
  int64_t *id = malloc(n * sizeof *id);
  unsigned *tag = malloc(2 * n * sizeof *tag);
  for (size_t i = 0; i < n; i++) id[i] = -1;
  index_args a = {id, tag};
  em_status st = run(k, g, b, 0, &a);
  int ok = st == EM_OK;
  if (!ok) printf("  %s: %s\n", k->name, err);
  for (size_t i = 0; ok && i < n; i++) {
    size_t t = i % bt, blk = i / bt;
    unsigned wt = (unsigned)(t % b.x) | (unsigned)(t / b.x % b.y) << 10 |
                  (unsigned)(t / b.x / b.y) << 20;
    unsigned wb = (unsigned)(blk % g.x) | (unsigned)(blk / g.x % g.y) << 10 |
                  (unsigned)(blk / g.x / g.y) << 20;
    if (id[i] != (int64_t)i || tag[2 * i] != wt || tag[2 * i + 1] != wb) {
      printf("  %s grid (%u,%u,%u) block (%u,%u,%u): element %zu wrong\n", k->name, g.x,
             g.y, g.z, b.x, b.y, b.z, i);
      ok = 0;
    }
  }
  free(id);
  free(tag);
  return ok;
}

typedef struct { const float *x; float *y; int n; } axpb_args;
/* y is (n,), x is (n,): y = 2x + 1 where i < n; blocks cross the end. */
EMK_KERNEL(k_axpb, axpb_args) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < a.n) a.y[i] = 2 * a.x[i] + 1;
}

static void test_indices(void) {
  CHECK(check_indices(&k_index, D3(1, 1, 1), D3(1, 1, 1)));
  CHECK(check_indices(&k_index, D3(1, 1, 1), D3(8, 4, 2)));
  CHECK(check_indices(&k_index, D3(3, 2, 4), D3(5, 3, 2)));
  CHECK(check_indices(&k_index, D3(7, 5, 3), D3(32, 4, 8)));
  CHECK(check_indices(&k_index, D1(1000), D1(1024)));
  CHECK(check_indices(&k_index, D3(1, 1, 1), D3(1024, 1, 1)));
  CHECK(check_indices(&k_index, D3(2, 1, 1), D3(1, 1, 64)));
  /* the same on fibers */
  CHECK(check_indices(&k_index_fibers, D3(3, 2, 4), D3(5, 3, 2)));
  CHECK(check_indices(&k_index_fibers, D3(2, 3, 1), D3(32, 4, 8)));
  /* n not a multiple of the block: the last block's extra threads write nothing */
  for (int n = 1; n <= 1000; n += 333) {
    float *x = malloc((n + 64) * sizeof *x), *y = malloc((n + 64) * sizeof *y);
    for (int i = 0; i < n + 64; i++) x[i] = (float)i, y[i] = -7;
    axpb_args a = {x, y, n};
    unsigned blocks = (unsigned)(n + 127) / 128;
    CHECK(run(&k_axpb, D1(blocks), D1(128), 0, &a) == EM_OK, "%s", err);
    int bad = 0;
    for (int i = 0; i < n + 64; i++) bad += y[i] != (i < n ? 2.0f * i + 1 : -7.0f);
    CHECK(bad == 0, "n %d: %d elements wrong", n, bad);
    free(x);
    free(y);
  }
}

/* -- Kernels: block reductions in shared memory ------------------------------------ */
typedef struct { const float *x; float *out; int n; } red_args;

/* out is (gridDim.x,): the sum of x over each block's blockDim.x (<= 256) elements. */
EMK_KERNEL_SYNC(k_block_sum, red_args) {
  EMK_SHARED(float, s, 256);
  unsigned t = threadIdx.x;
  int i = blockIdx.x * blockDim.x + t;
  s[t] = i < a.n ? a.x[i] : 0;
  EMK_SYNCTHREADS();
  for (unsigned st = blockDim.x / 2; st > 0; st >>= 1) {
    if (t < st) s[t] += s[t + st];
    EMK_SYNCTHREADS();
  }
  if (t == 0) a.out[blockIdx.x] = s[0];
}

/* The same without the barrier after the loads: a thread adds s[t + st] before
** its writer stored it. */
EMK_KERNEL_SYNC(k_block_sum_nosync_load, red_args) {
  EMK_SHARED(float, s, 256);
  unsigned t = threadIdx.x;
  int i = blockIdx.x * blockDim.x + t;
  s[t] = i < a.n ? a.x[i] : 0;
  for (unsigned st = blockDim.x / 2; st > 0; st >>= 1) {
    if (t < st) s[t] += s[t + st];
    EMK_SYNCTHREADS();
  }
  if (t == 0) a.out[blockIdx.x] = s[0];
}

/* ... and without the barrier inside the loop. */
EMK_KERNEL_SYNC(k_block_sum_nosync_loop, red_args) {
  EMK_SHARED(float, s, 256);
  unsigned t = threadIdx.x;
  int i = blockIdx.x * blockDim.x + t;
  s[t] = i < a.n ? a.x[i] : 0;
  EMK_SYNCTHREADS();
  for (unsigned st = blockDim.x / 2; st > 0; st >>= 1)
    if (t < st) s[t] += s[t + st];
  if (t == 0) a.out[blockIdx.x] = s[0];
}

/* Sums 1..n with blocks of bt threads; returns the total of the block sums. */
static double block_sum(const emk_kernel *k, int n, unsigned bt, em_status *st) {
  float *x = malloc(n * sizeof *x);
  unsigned blocks = (unsigned)(n + bt - 1) / bt;
  float *out = malloc(blocks * sizeof *out);
  for (int i = 0; i < n; i++) x[i] = (float)(i + 1);
  red_args a = {x, out, n};
  *st = run(k, D1(blocks), D1(bt), 0, &a);
  double s = 0;
  for (unsigned b = 0; b < blocks; b++) s += out[b];
  free(x);
  free(out);
  return s;
}

static void test_block_reduce(void) {
  em_status st;
  int sizes[] = {1, 31, 256, 1000, 4096};
  for (int i = 0; i < 5; i++) {
    int n = sizes[i];
    double want = (double)n * (n + 1) / 2, got = block_sum(&k_block_sum, n, 256, &st);
    CHECK(st == EM_OK, "%s", err);
    CHECK(got == want, "n %d: sum %.1f, want %.1f", n, got, want);
    got = block_sum(&k_block_sum, n, 64, &st);
    CHECK(st == EM_OK && got == want, "n %d, 64 threads: sum %.1f, want %.1f", n, got, want);
  }
  /* A missing barrier makes the result wrong, every time. */
  for (int rep = 0; rep < 2; rep++) {
    double want = 4096.0 * 4097 / 2;
    double got = block_sum(&k_block_sum_nosync_load, 4096, 256, &st);
    CHECK(st == EM_OK, "%s", err);
    CHECK(got != want, "without the barrier after the loads the sum is still %.1f", got);
    got = block_sum(&k_block_sum_nosync_loop, 4096, 256, &st);
    CHECK(st == EM_OK, "%s", err);
    CHECK(got != want, "without the loop's barrier the sum is still %.1f", got);
  }
  /* The reverse schedule: a correct kernel is still right. */
  setenv("EMBER_EMU_SCHEDULE", "reverse", 1);
  double got = block_sum(&k_block_sum, 1000, 256, &st);
  unsetenv("EMBER_EMU_SCHEDULE");
  CHECK(st == EM_OK && got == 500500.0, "reverse schedule: sum %.1f", got);
}

/* out is (32, 32) = in transposed, through a padded shared tile, block (32, 8). */
typedef struct { const float *in; float *out; } tr_args;
EMK_KERNEL_SYNC(k_transpose, tr_args) {
  EMK_SHARED_2D(float, tile, 32, 33);
  unsigned x = threadIdx.x;
  for (unsigned y = threadIdx.y; y < 32; y += blockDim.y) tile[y][x] = a.in[y * 32 + x];
  EMK_SYNCTHREADS();
  for (unsigned y = threadIdx.y; y < 32; y += blockDim.y) a.out[y * 32 + x] = tile[x][y];
}

static void test_transpose(void) {
  float in[1024], out[1024];
  for (int i = 0; i < 1024; i++) in[i] = (float)i;
  tr_args a = {in, out};
  CHECK(run(&k_transpose, D1(1), D3(32, 8, 1), 0, &a) == EM_OK, "%s", err);
  int bad = 0;
  for (int r = 0; r < 32; r++)
    for (int c = 0; c < 32; c++) bad += out[r * 32 + c] != in[c * 32 + r];
  CHECK(bad == 0, "%d elements wrong", bad);
}

/* -- Kernels: warp operations ------------------------------------------------------- */
typedef struct {
  const float *xf; const int *xi; const double *xd; const int64_t *xl;
  float *sumf, *maxf; int *sumi, *maxi; double *sumd; int64_t *suml;
  float *bfly; int *scan; int *bcast; unsigned *ballot; int *all;
} warp_args;

/* Per warp w (32 lanes): sums and maxima with shuffles down (lane 0 has them),
** a butterfly sum every lane has, an inclusive scan with shuffles up, a broadcast
** of lane 5 and a ballot of odd values. */
EMK_KERNEL_SYNC(k_warp, warp_args) {
  unsigned t = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32,
           w = t / 32;
  float sf = a.xf[t], mf = sf, bf = sf;
  int si = a.xi[t], mi = si, sc = si;
  double sd = a.xd[t];
  int64_t sl = a.xl[t];
  for (int o = 16; o > 0; o >>= 1) {
    sf += emk_shfl_down_sync(EMK_FULL_MASK, sf, o);
    mf = fmaxf(mf, emk_shfl_down_sync(EMK_FULL_MASK, mf, o));
    si += emk_shfl_down_sync(EMK_FULL_MASK, si, o);
    int oi = emk_shfl_down_sync(EMK_FULL_MASK, mi, o);
    mi = oi > mi ? oi : mi;
    sd += emk_shfl_down_sync(EMK_FULL_MASK, sd, o);
    sl += emk_shfl_down_sync(EMK_FULL_MASK, sl, o);
    bf += emk_shfl_xor_sync(EMK_FULL_MASK, bf, o);
  }
  for (int o = 1; o < 32; o <<= 1) {
    int up = emk_shfl_up_sync(EMK_FULL_MASK, sc, o);
    if (lane >= (unsigned)o) sc += up;
  }
  a.bfly[t] = bf;
  a.scan[t] = sc;
  a.bcast[t] = emk_shfl_sync(EMK_FULL_MASK, a.xi[t], 5);
  unsigned bal = emk_ballot_sync(EMK_FULL_MASK, a.xi[t] & 1);
  int all = emk_all_sync(EMK_FULL_MASK, a.xi[t] > -1000) + 2 * emk_any_sync(EMK_FULL_MASK, a.xi[t] == 7);
  EMK_SYNCWARP(EMK_FULL_MASK);
  if (lane == 0) {
    a.sumf[w] = sf; a.maxf[w] = mf; a.sumi[w] = si; a.maxi[w] = mi;
    a.sumd[w] = sd; a.suml[w] = sl; a.ballot[w] = bal; a.all[w] = all;
  }
}

static void test_warp_ops(void) {
  enum { N = 256, W = N / 32 };
  float xf[N], sumf[W], maxf[W], bfly[N];
  int xi[N], sumi[W], maxi[W], scan[N], bcast[N], all[W];
  double xd[N], sumd[W];
  int64_t xl[N], suml[W];
  unsigned ballot[W];
  for (int i = 0; i < N; i++) {
    xi[i] = (i * 37) % 101 - 50;
    xf[i] = (float)xi[i] * 0.5f;
    xd[i] = xi[i] * 0.25;
    xl[i] = (int64_t)xi[i] * ((int64_t)1 << 33);
  }
  warp_args a = {xf, xi, xd, xl, sumf, maxf, sumi, maxi, sumd, suml, bfly, scan, bcast,
                 ballot, all};
  REQUIRE(run(&k_warp, D1(2), D1(N / 2), 0, &a) == EM_OK, "%s", err);
  int bad = 0;
  for (int w = 0; w < W; w++) {
    float wsf = 0, wmf = -1e30f;
    int wsi = 0, wmi = -1000000, sc = 0, wall = 1, wany = 0;
    double wsd = 0;
    int64_t wsl = 0;
    unsigned wb = 0;
    for (int l = 0; l < 32; l++) {
      int i = w * 32 + l;
      wsf += xf[i]; wmf = xf[i] > wmf ? xf[i] : wmf;
      wsi += xi[i]; wmi = xi[i] > wmi ? xi[i] : wmi;
      wsd += xd[i]; wsl += xl[i];
      wb |= (unsigned)(xi[i] & 1) << l;
      wall &= xi[i] > -1000;
      wany |= xi[i] == 7;
      sc += xi[i];
      bad += scan[i] != sc;
      bad += bcast[i] != xi[w * 32 + 5];
    }
    for (int l = 0; l < 32; l++) bad += bfly[w * 32 + l] != wsf;
    CHECK(sumf[w] == wsf && maxf[w] == wmf, "warp %d: float sum %g max %g, want %g %g", w,
          sumf[w], maxf[w], wsf, wmf);
    CHECK(sumi[w] == wsi && maxi[w] == wmi, "warp %d: int sum %d max %d, want %d %d", w,
          sumi[w], maxi[w], wsi, wmi);
    CHECK(sumd[w] == wsd && suml[w] == wsl, "warp %d: double/int64 sums", w);
    CHECK(ballot[w] == wb, "warp %d: ballot 0x%08x, want 0x%08x", w, ballot[w], wb);
    CHECK(all[w] == wall + 2 * wany, "warp %d: all/any %d, want %d", w, all[w], wall + 2 * wany);
  }
  CHECK(bad == 0, "%d scan/broadcast/butterfly values wrong", bad);
}

/* A block of 48 threads: the second warp has 16 lanes; a full mask still works
** (absent lanes are dropped), and widths of 16 make independent halves. */
typedef struct { int *out; } small_args;
EMK_KERNEL_SYNC(k_short_warp, small_args) {
  unsigned t = threadIdx.x;
  int v = emk_shfl_sync(EMK_FULL_MASK, (int)t, 0);   /* lane 0 of each warp */
  int s = (int)t;
  for (int o = 8; o > 0; o >>= 1) s += emk_shfl_xor_sync_w(EMK_FULL_MASK, s, o, 16);
  a.out[2 * t] = v;
  a.out[2 * t + 1] = s;
}

static void test_short_warp(void) {
  int out[96];
  small_args a = {out};
  REQUIRE(run(&k_short_warp, D1(1), D1(48), 0, &a) == EM_OK, "%s", err);
  int bad = 0;
  for (int t = 0; t < 48; t++) {
    int g = t / 16 * 16;
    bad += out[2 * t] != (t < 32 ? 0 : 32);
    bad += out[2 * t + 1] != 16 * g + 120;   /* sum of g .. g+15 */
  }
  CHECK(bad == 0, "%d values wrong", bad);
}

/* -- Errors a GPU turns into hangs ---------------------------------------------------- */
typedef struct { int *out; } err_args;

EMK_KERNEL_SYNC(k_partial_barrier, err_args) {
  if (threadIdx.x < 16) return;
  EMK_SYNCTHREADS();
  a.out[threadIdx.x] = 1;
}

EMK_KERNEL(k_undeclared_sync, err_args) {
  a.out[threadIdx.x] = 1;
  EMK_SYNCTHREADS();
}

EMK_KERNEL(k_undeclared_shfl, err_args) {
  a.out[threadIdx.x] = emk_shfl_down_sync(EMK_FULL_MASK, (int)threadIdx.x, 1);
}

EMK_KERNEL_SYNC(k_partial_shfl, err_args) {
  if (threadIdx.x >= 8) return;
  a.out[threadIdx.x] = emk_shfl_down_sync(EMK_FULL_MASK, (int)threadIdx.x, 1);
}

EMK_KERNEL_SYNC(k_mismatched_shfl, err_args) {
  int v = (int)threadIdx.x;
  if (threadIdx.x & 1) v = emk_shfl_xor_sync(EMK_FULL_MASK, v, 1);
  else v = emk_shfl_down_sync(EMK_FULL_MASK, v, 1);
  a.out[threadIdx.x] = v;
}

EMK_KERNEL_SYNC(k_barrier_vs_shfl, err_args) {
  int v = (int)threadIdx.x;
  if (threadIdx.x < 16) v = emk_shfl_down_sync(EMK_FULL_MASK, v, 1);
  else EMK_SYNCTHREADS();
  a.out[threadIdx.x] = v;
}

/* Only the second block misbehaves. */
EMK_KERNEL_SYNC(k_partial_barrier_block1, err_args) {
  if (blockIdx.x == 1 && threadIdx.x == 3) return;
  EMK_SYNCTHREADS();
}

static void test_errors(void) {
  int out[1024] = {0};
  err_args a = {out};
  em_status st = run(&k_partial_barrier, D1(2), D1(32), 0, &a);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_partial_barrier", "block (0,0,0)",
                                             "16 of 32", "16 exited", (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_partial_barrier_block1, D1(3), D1(64), 0, &a);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_partial_barrier_block1",
                                             "block (1,0,0)", "63 of 64",
                                             "thread (3,0,0)", (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_undeclared_sync, D1(1), D1(32), 0, &a);
  CHECK(st == EM_ERR_INTERNAL &&
            chk_msg_has(err, "kernel k_undeclared_sync uses __syncthreads but was not "
                             "declared with EMK_KERNEL_SYNC", (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_undeclared_shfl, D1(1), D1(32), 0, &a);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_undeclared_shfl", "__shfl_down_sync",
                                             "EMK_KERNEL_SYNC", (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_partial_shfl, D1(1), D1(32), 0, &a);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_partial_shfl", "warp 0",
                                             "lanes 0x000000ff", "0xffffff00 exited",
                                             (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_mismatched_shfl, D1(1), D1(32), 0, &a);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_mismatched_shfl", "lane 1",
                                             "__shfl_xor_sync", "__shfl_down_sync",
                                             (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_barrier_vs_shfl, D1(1), D1(32), 0, &a);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_barrier_vs_shfl", "16 of 32",
                                             "16 wait at __shfl_down_sync", (char *)NULL),
        "status %d: %s", st, err);
  /* After a failure the emulator is as good as new. */
  em_status st2;
  double got = block_sum(&k_block_sum, 300, 256, &st2);
  CHECK(st2 == EM_OK && got == 45150.0, "sum %.1f after errors: %s", got, err);
}

/* -- Shared memory: dynamic, static beside it, poison ----------------------------------- */
typedef struct { const float *x; float *y; unsigned char *peek; } dyn_args;

/* y is (blocks, blockDim.x): each block's slice of x reversed through dynamic
** shared memory; a static array beside it holds twice the values. Thread 0 first
** copies out 8 bytes of each that no thread wrote yet (the poison). */
EMK_KERNEL_SYNC(k_dyn_reverse, dyn_args) {
  EMK_DYN_SHARED(float, d);
  EMK_SHARED(float, s, 1024);
  unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
  if (t == 0 && blockIdx.x == 1) {
    memcpy(a.peek, d + n - 2, 8);
    memcpy(a.peek + 8, s + n - 2, 8);
  }
  EMK_SYNCTHREADS();
  d[t] = a.x[base + t];
  s[t] = 2 * a.x[base + t];
  EMK_SYNCTHREADS();
  a.y[base + t] = d[n - 1 - t] + s[n - 1 - t];
}

typedef struct { int dummy; } big_args;
EMK_KERNEL(k_big_static, big_args) {
  EMK_SHARED(float, big, 13000);   /* 52000 bytes */
  big[threadIdx.x] = 0;
}
EMK_KERNEL(k_10k_static, big_args) {
  EMK_SHARED(char, s, 10000);
  s[threadIdx.x] = 0;
}

static void test_shared(void) {
  enum { B = 3, T = 200 };
  float x[B * T], y[B * T];
  unsigned char peek[16];
  for (int i = 0; i < B * T; i++) x[i] = (float)i;
  dyn_args a = {x, y, peek};
  REQUIRE(run(&k_dyn_reverse, D1(B), D1(T), T * sizeof(float), &a) == EM_OK, "%s", err);
  int bad = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) bad += y[b * T + t] != 3 * x[b * T + T - 1 - t];
  CHECK(bad == 0, "%d values wrong", bad);
  int poisoned = 1;
  for (int i = 0; i < 16; i++) poisoned &= peek[i] == EMK_SHARED_POISON;
  CHECK(poisoned, "shared memory at a block's start is not the poison (0x%02x...)", peek[0]);

  /* Limits: 48 KiB in all. */
  big_args ba = {0};
  em_status st = run(&k_big_static, D1(1), D1(32), 0, &ba);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_big_static", "52000", "49152",
                                             (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_10k_static, D1(2), D1(32), 40 * 1024, &ba);
  CHECK(st == EM_ERR_INTERNAL && chk_msg_has(err, "k_10k_static", "40960", "10000",
                                             (char *)NULL),
        "status %d: %s", st, err);
  CHECK(run(&k_10k_static, D1(2), D1(32), 38 * 1024, &ba) == EM_OK, "%s", err);
  st = run(&k_10k_static, D1(1), D1(32), 48 * 1024 + 1, &ba);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "k_10k_static", "49153", "dynamic shared",
                                        (char *)NULL),
        "status %d: %s", st, err);
}

/* -- Launch limits ---------------------------------------------------------------------- */
static void test_limits(void) {
  int out[4096];
  err_args a = {out};
  em_status st = run(&k_undeclared_sync, D1(1), D1(1025), 0, &a);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "k_undeclared_sync", "1025 threads", "1024",
                                        (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_partial_barrier, D1(1), D3(32, 32, 2), 0, &a);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "k_partial_barrier", "2048 threads",
                                        (char *)NULL),
        "status %d: %s", st, err);
  st = run(&k_partial_barrier, D1(1), D3(1, 1, 65), 0, &a);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "z at most 64", (char *)NULL), "%s", err);
  st = run(&k_partial_barrier, D1(1), D3(32, 0, 1), 0, &a);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "zero dimension", (char *)NULL), "%s", err);
  st = run(&k_partial_barrier, D3(0, 1, 1), D1(32), 0, &a);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "grid (0,1,1)", (char *)NULL), "%s", err);
  st = run(&k_partial_barrier, D3(1, 65536, 1), D1(32), 0, &a);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "too large", (char *)NULL), "%s", err);
  emk_kernel nohost = {"k_nvcc_only", NULL, NULL, 0};
  st = run(&nohost, D1(1), D1(1), 0, &a);
  CHECK(st == EM_ERR_ARG && chk_msg_has(err, "k_nvcc_only", "no host body", (char *)NULL),
        "%s", err);
}

/* -- Atomics: a histogram ------------------------------------------------------------------ */
typedef struct {
  const int *x; int n; int *hist; float *fsum; double *dsum; int64_t *lsum; int *mx;
} hist_args;

EMK_KERNEL(k_hist, hist_args) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  int v = a.x[i];
  emk_atomic_add_i32(&a.hist[v], 1);
  emk_atomic_add_f32(a.fsum, 0.5f);
  emk_atomic_add_f64(a.dsum, v * 0.25);
  emk_atomic_add_i64(a.lsum, (int64_t)v << 32);
  emk_atomic_max_i32(a.mx, v);
}

/* Per-block histogram in shared memory, merged with atomics: block size 256,
** 16 bins. */
EMK_KERNEL_SYNC(k_hist_shared, hist_args) {
  EMK_SHARED(int, h, 16);
  unsigned t = threadIdx.x;
  if (t < 16) h[t] = 0;
  EMK_SYNCTHREADS();
  int i = blockIdx.x * blockDim.x + t;
  if (i < a.n) emk_atomic_add_i32(&h[a.x[i]], 1);
  EMK_SYNCTHREADS();
  if (t < 16) emk_atomic_add_i32(&a.hist[t], h[t]);
}

static void test_atomics(void) {
  enum { N = 5000 };
  static int x[N];
  int hist[16] = {0}, want[16] = {0}, mx = -1;
  float fsum = 0;
  double dsum = 0, wd = 0;
  int64_t lsum = 0, wl = 0;
  for (int i = 0; i < N; i++) {
    x[i] = (i * 7 + i / 13) % 16;
    want[x[i]]++;
    wd += x[i] * 0.25;
    wl += (int64_t)x[i] << 32;
  }
  hist_args a = {x, N, hist, &fsum, &dsum, &lsum, &mx};
  REQUIRE(run(&k_hist, D1((N + 255) / 256), D1(256), 0, &a) == EM_OK, "%s", err);
  CHECK(!memcmp(hist, want, sizeof hist), "histogram differs");
  CHECK(fsum == N * 0.5f && dsum == wd && lsum == wl && mx == 15,
        "sums %g %g %lld, max %d", fsum, dsum, (long long)lsum, mx);
  memset(hist, 0, sizeof hist);
  REQUIRE(run(&k_hist_shared, D1((N + 255) / 256), D1(256), 0, &a) == EM_OK, "%s", err);
  CHECK(!memcmp(hist, want, sizeof hist), "shared-memory histogram differs");
}

/* -- Launches from several threads at once (as the emulated streams do) ------------------- */
typedef struct { int id; int ok; } worker;

static void *worker_main(void *p) {
  worker *wk = p;
  char e[256];
  enum { N = 3000 };
  float *x = malloc(N * sizeof *x), out[(N + 127) / 128];
  for (int i = 0; i < N; i++) x[i] = (float)(i % 100 + wk->id);
  double want = 0;
  for (int i = 0; i < N; i++) want += x[i];
  wk->ok = 1;
  for (int rep = 0; rep < 20; rep++) {
    red_args a = {x, out, N};
    em_status st = emk_grid_run(&k_block_sum, D1((N + 127) / 128), D1(128), 0, &a, e, sizeof e);
    double s = 0;
    for (int b = 0; b < (N + 127) / 128; b++) s += out[b];
    if (st != EM_OK || s != want) wk->ok = 0;
    /* and an error now and then, which must stay in this thread's launch */
    int o[64];
    err_args ea = {o};
    if (emk_grid_run(&k_partial_barrier, D1(1), D1(32), 0, &ea, e, sizeof e) != EM_ERR_INTERNAL)
      wk->ok = 0;
  }
  free(x);
  return NULL;
}

static void test_threads(void) {
  pthread_t th[4];
  worker wk[4];
  for (int i = 0; i < 4; i++) {
    wk[i] = (worker){i, 0};
    pthread_create(&th[i], NULL, worker_main, &wk[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(wk[i].ok, "thread %d got a wrong result", i);
  }
}

/* -- Speed (printed, not asserted) ------------------------------------------------------------ */
static void test_speed(void) {
  int n = 1 << 22;
  float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  for (int i = 0; i < n; i++) x[i] = (float)(i & 1023);
  axpb_args a = {x, y, n};
  double t0 = now();
  em_status st = run(&k_axpb, D1((unsigned)n / 256), D1(256), 0, &a);
  double plain = n / (now() - t0);
  CHECK(st == EM_OK, "%s", err);
  int nf = 1 << 20;
  red_args r = {x, y, nf};
  t0 = now();
  st = run(&k_block_sum, D1((unsigned)nf / 256), D1(256), 0, &r);
  double fib = nf / (now() - t0);
  CHECK(st == EM_OK, "%s", err);
  /* One launch of one small block: what a tiny sync kernel costs (stacks etc.). */
  float o[1];
  red_args r1 = {x, o, 256};
  t0 = now();
  for (int i = 0; i < 100; i++) st = run(&k_block_sum, D1(1), D1(256), 0, &r1);
  double launch_us = (now() - t0) / 100 * 1e6;
  printf("  speed: plain path %.0f M threads/s; fibers (256-thread blocks, 9 barriers "
         "each) %.1f M threads/s; a 1-block 256-thread fiber launch %.0f us\n",
         plain / 1e6, fib / 1e6, launch_us);
  free(x);
  free(y);
}

int main(void) {
  /* this test chooses its schedules itself (the default, and reverse where it
  ** says so): what it asserts depends on them */
  unsetenv("EMBER_EMU_SCHEDULE");
  RUN(test_indices);
  RUN(test_block_reduce);
  RUN(test_transpose);
  RUN(test_warp_ops);
  RUN(test_short_warp);
  RUN(test_errors);
  RUN(test_shared);
  RUN(test_limits);
  RUN(test_atomics);
  RUN(test_threads);
  RUN(test_speed);
  return check_done();
}
