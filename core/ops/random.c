/*
** random.c -- random fills (uniform_, normal_, randint_), the RNG state, and the
** counting factories arange and eye.
**
** The generator is counter-based (philox.h): the state is only a key (the seed)
** and the next unused counter (the offset). A draw hands the backend its key and
** starting counter and then moves the offset past the counters the draw used, so
** the numbers never depend on how the work is split over threads or devices, and
** saving (seed, offset) is enough to replay a stream exactly.
*/
#include "../autograd/autograd.h"
#include "../philox.h"
#include <math.h>

/* -- State ------------------------------------------------------------------------ */

void em_manual_seed(em_state *S, uint64_t seed) {
  S->rng_seed = seed;
  S->rng_offset = 0;
}

void em_rng_get_state(em_state *S, uint64_t *seed, uint64_t *offset) {
  if (seed) *seed = S->rng_seed;
  if (offset) *offset = S->rng_offset;
}

void em_rng_set_state(em_state *S, uint64_t seed, uint64_t offset) {
  S->rng_seed = seed;
  S->rng_offset = offset;
}

/* -- Draws ----------------------------------------------------------------------------- */

static em_status check_float_target(em_state *S, const char *op, const em_tensor *t) {
  em_status st = emi_check_tensor(S, op, t);
  if (st || (st = emi_ag_inplace(S, op, t))) return st;
  if (!em_dtype_is_floating(t->dtype))
    return emi_error(S, EM_ERR_DTYPE, "%s: expected a floating-point tensor, got %s "
                     "(em.randint or Tensor:random_ make integers)", op, em_dtype_name(t->dtype));
  return EM_OK;
}

em_status em_uniform_(em_state *S, em_tensor *t, double lo, double hi) {
  em_status st = check_float_target(S, "uniform_", t);
  if (st) return st;
  if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi))
    return emi_error(S, EM_ERR_ARG, "uniform_: expects a finite range [lo, hi) with "
                     "lo <= hi, got lo=%g, hi=%g", lo, hi);
  if (t->numel == 0) return EM_OK;
  uint64_t used = emi_rng_counters(t->numel, emi_rng_words(t->dtype));
  if ((st = EMI_DISPATCH(S, "uniform_", t, uniform, t, S->rng_seed, S->rng_offset, lo, hi)))
    return st;
  S->rng_offset += used;
  return EM_OK;
}

em_status em_normal_(em_state *S, em_tensor *t, double mean, double std) {
  em_status st = check_float_target(S, "normal_", t);
  if (st) return st;
  if (!(std >= 0) || !isfinite(std) || !isfinite(mean))
    return emi_error(S, EM_ERR_ARG, "normal_: expects a finite mean and std >= 0, got "
                     "mean=%g, std=%g", mean, std);
  if (t->numel == 0) return EM_OK;
  uint64_t used = emi_rng_counters(t->numel, emi_rng_words(t->dtype));
  if ((st = EMI_DISPATCH(S, "normal_", t, normal, t, S->rng_seed, S->rng_offset, mean, std)))
    return st;
  S->rng_offset += used;
  return EM_OK;
}

/* Largest integer magnitude a dtype holds exactly (for floats: 2^mantissa digits). */
static void dtype_int_range(em_dtype dt, double *lo, double *hi) {
  switch (dt) {
  case EM_BOOL: *lo = 0; *hi = 1; break;
  case EM_UINT8: *lo = 0; *hi = 255; break;
  case EM_INT32: *lo = -2147483648.0; *hi = 2147483647.0; break;
  case EM_INT64: *lo = -9.3e18; *hi = 9.3e18; break;  /* any int64 */
  case EM_FLOAT16: *lo = -2048; *hi = 2048; break;
  case EM_BFLOAT16: *lo = -256; *hi = 256; break;
  case EM_FLOAT32: *lo = -16777216.0; *hi = 16777216.0; break;
  default: *lo = -9007199254740992.0; *hi = 9007199254740992.0; break;
  }
}

em_status em_randint_(em_state *S, em_tensor *t, int64_t lo, int64_t hi) {
  em_status st = emi_check_tensor(S, "randint_", t);
  if (st) return st;
  if (hi <= lo)
    return emi_error(S, EM_ERR_ARG, "randint_: expects lo < hi (hi exclusive), got "
                     "lo=%lld, hi=%lld", (long long)lo, (long long)hi);
  double dlo, dhi;
  dtype_int_range(t->dtype, &dlo, &dhi);
  if ((double)lo < dlo || (double)(hi - 1) > dhi)
    return emi_error(S, EM_ERR_ARG, "randint_: range [%lld, %lld) does not fit in %s",
                     (long long)lo, (long long)hi, em_dtype_name(t->dtype));
  if (t->numel == 0) return EM_OK;
  uint64_t range = (uint64_t)hi - (uint64_t)lo;
  uint64_t used = emi_rng_counters(t->numel, emi_rng_randint_words(range));
  if ((st = EMI_DISPATCH(S, "randint_", t, randint, t, S->rng_seed, S->rng_offset, lo, hi)))
    return st;
  S->rng_offset += used;
  return EM_OK;
}

/* -- Factories ------------------------------------------------------------------------ */

/* PyTorch's rules: the count is ceil((stop - start) / step); for integer dtypes
** the bounds and the step are truncated to integers first (as torch does for
** int64), so the values are exact and evenly spaced. */
em_status em_arange(em_state *S, double start, double stop, double step, em_dtype dt,
                    int device, em_tensor **out) {
  if ((unsigned)dt >= EM_NUM_DTYPES)
    return emi_error(S, EM_ERR_DTYPE, "arange: invalid dtype %d", (int)dt);
  if (!isfinite(start) || !isfinite(stop) || !isfinite(step))
    return emi_error(S, EM_ERR_ARG, "arange: start, stop and step must be finite, got "
                     "%g, %g, %g", start, stop, step);
  if (!em_dtype_is_floating(dt)) {
    start = trunc(start); stop = trunc(stop); step = trunc(step);
  }
  if (step == 0)
    return emi_error(S, EM_ERR_ARG, "arange: step must be nonzero%s",
                     em_dtype_is_floating(dt) ? "" : " (after truncation to an integer)");
  if ((step > 0 && stop < start) || (step < 0 && stop > start))
    return emi_error(S, EM_ERR_ARG, "arange: step %g goes the wrong way from %g to %g",
                     step, start, stop);
  double count = ceil((stop - start) / step);
  if (!(count < 9e15))
    return emi_error(S, EM_ERR_ARG, "arange: too many elements (%g)", count);
  int64_t n = (int64_t)count;
  em_tensor *t;
  em_status st = emi_tensor_new(S, "arange", &n, 1, dt, device, &t);
  if (st) return st;
  if (n > 0 && (st = EMI_DISPATCH(S, "arange", t, arange, t, start, step))) {
    em_tensor_release(t);
    return st;
  }
  *out = t;
  return EM_OK;
}

/* m < 0 means square. Zeros, then ones along the diagonal through a strided view
** (stride m + 1), so the backend needs nothing beyond fill. */
em_status em_eye(em_state *S, int64_t n, int64_t m, em_dtype dt, int device,
                 em_tensor **out) {
  if (m < 0) m = n;
  if (n < 0)
    return emi_error(S, EM_ERR_ARG, "eye: n must be >= 0, got %lld", (long long)n);
  int64_t sizes[2] = {n, m};
  em_tensor *t;
  em_status st = emi_tensor_new(S, "eye", sizes, 2, dt, device, &t);
  if (st) return st;
  if (t->numel > 0) {
    /* the diagonal as a handle on the stack: fill only uses it during the call */
    em_tensor diag = *t;
    diag.ndim = 1;
    diag.sizes[0] = diag.numel = n < m ? n : m;
    diag.strides[0] = m + 1;
    if ((st = EMI_DISPATCH(S, "eye", t, fill, t, 0)) ||
        (st = EMI_DISPATCH(S, "eye", t, fill, &diag, 1))) {
      em_tensor_release(t);
      return st;
    }
  }
  *out = t;
  return EM_OK;
}
