/*
** k_random.c -- the launchers of uniform, normal, randint and arange
** (k_random.cu): each entry computes, with the CPU's own functions, the
** constants that depend only on the arguments (the float32 bounds, the largest
** value below hi, the words per draw), and queues the kernel on the compute
** stream.
*/
#include "cuda.h"
#include "k_random.h"
#include "k_random_args.h"
#include "philox.h"
#include <math.h>

static em_status launch(emi_device *d, const char *op, rnd_args *a) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  int64_t blocks = (a->n + THREADS - 1) / THREADS;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  if (blocks < 1) blocks = 1;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, &k_random, grid, block, 0, cd->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

static void geometry(rnd_args *a, em_tensor *out, int op, uint64_t seed, uint64_t offset) {
  memset(a, 0, sizeof *a);
  a->out = (char *)em_tensor_data(out);
  a->n = a->numel = out->numel;
  a->ndim = out->ndim;
  a->dt = out->dtype;
  a->esize = (int)em_dtype_size(out->dtype);
  a->op = op;
  a->seed = seed;
  a->offset = offset;
  for (int k = 0; k < out->ndim; k++) {
    a->sizes[k] = out->sizes[k];
    a->strides[k] = out->strides[k];
  }
}

static float round_to(float x, em_dtype dt) {
  return dt == EM_FLOAT16 ? emi_half_to_float(emi_float_to_half(x))
                          : emi_bf16_to_float(emi_float_to_bf16(x));
}

/* The largest value of dt (float16 or bfloat16) below hi (core/cpu/random.c's). */
static float below(float hi, em_dtype dt) {
  uint16_t h = dt == EM_FLOAT16 ? emi_float_to_half(hi) : emi_float_to_bf16(hi);
  float r = dt == EM_FLOAT16 ? emi_half_to_float(h) : emi_bf16_to_float(h);
  if (r >= hi) {
    if (r == 0) h = 0x8001;
    else if (h & 0x8000) h++;
    else h--;
    r = dt == EM_FLOAT16 ? emi_half_to_float(h) : emi_bf16_to_float(h);
  }
  return r;
}

em_status emk_uniform(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                      double lo, double hi) {
  if (out->numel == 0) return EM_OK;
  rnd_args a;
  geometry(&a, out, R_UNIFORM, seed, offset);
  double span = hi - lo;
  a.dlo = lo;
  a.dspan = span;
  a.dhi = lo + span;
  a.dtop = nextafter(a.dhi, -INFINITY);
  a.flo = (float)lo;
  a.fspan = (float)span;
  a.fhi = (float)(lo + span);
  if (out->dtype == EM_FLOAT32) a.ftop = nextafterf(a.fhi, -INFINITY);
  else if (out->dtype != EM_FLOAT64)
    a.ftop = a.fspan > 0 ? below(a.fhi, out->dtype) : round_to(a.flo, out->dtype);
  return launch(d, "uniform_", &a);
}

em_status emk_normal(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                     double mean, double std) {
  if (out->numel == 0) return EM_OK;
  rnd_args a;
  geometry(&a, out, R_NORMAL, seed, offset);
  a.dlo = mean;
  a.dspan = std;
  a.n = (out->numel + 1) / 2;
  return launch(d, "normal_", &a);
}

em_status emk_randint(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                      int64_t lo, int64_t hi) {
  if (out->numel == 0) return EM_OK;
  rnd_args a;
  geometry(&a, out, R_RANDINT, seed, offset);
  a.lo = lo;
  a.range = (uint64_t)hi - (uint64_t)lo;
  a.words = emi_rng_randint_words(a.range);
  return launch(d, "randint_", &a);
}

em_status emk_arange(emi_device *d, em_tensor *out, double start, double step) {
  if (out->numel == 0) return EM_OK;
  rnd_args a;
  geometry(&a, out, R_ARANGE, 0, 0);
  a.start = start;
  a.step = step;
  return launch(d, "arange", &a);
}
