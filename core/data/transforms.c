/*
** transforms.c -- what every transform shares (the refcounted object, running
** one in a context, em_transform_apply for a single sample), the value
** transforms (to_float, normalize) and the combinators (compose, custom).
** The geometric ones (crops, resize, flip, cutout) are in transforms_geom.c.
**
** A transform's apply runs on loader worker threads, so it reports only
** through emi_dfail into its context and allocates only with emi_dtensor_new
** (see data.h); construction runs on the caller's thread and uses emi_error.
** Built-in transforms read fields[0] through its strides (a sample of an
** in-memory dataset is a view of one row) and put a new contiguous tensor in
** its place, never writing into the input: it may be the dataset's own memory.
*/
#include "data.h"
#include <math.h>
#include <stdio.h>

/* -- The object ----------------------------------------------------------------- */

em_status emi_transform_new(em_state *S, const emi_transform_vt *vt, void *impl,
                            size_t impl_size, em_transform **out) {
  *out = NULL;
  em_transform *t = emi_malloc(S, sizeof *t);
  if (!t) {
    /* impl is ours either way: destroy it through a stand-in handle. */
    em_transform tmp = {1, S, vt, impl, impl_size};
    if (vt->destroy) vt->destroy(&tmp);
    emi_free(S, impl, impl_size);
    return emi_error(S, EM_ERR_NOMEM, "transform %s: out of memory", vt->name);
  }
  t->refcount = 1;
  t->S = S;
  t->vt = vt;
  t->impl = impl;
  t->impl_size = impl_size;
  *out = t;
  return EM_OK;
}

em_status emi_transform_run(em_transform *t, emi_dctx *c, emi_drng *rng,
                            em_tensor **fields, int nfields) {
  if (!t) return emi_dfail(c, EM_ERR_ARG, "transform: NULL transform");
  if (!fields || nfields < 1 || nfields > EM_DATA_MAX_FIELDS)
    return emi_dfail(c, EM_ERR_ARG, "%s: a sample has 1 to %d fields, got %d",
                     em_transform_name(t), (int)EM_DATA_MAX_FIELDS, nfields);
  for (int k = 0; k < nfields; k++)
    if (!fields[k])
      return emi_dfail(c, EM_ERR_ARG, "%s: field %d of the sample is NULL",
                       em_transform_name(t), k + 1);
  return t->vt->apply(t, c, rng, fields, nfields);
}

void em_transform_retain(em_transform *t) {
  if (t) emi_atomic_inc(&t->refcount);
}

void em_transform_release(em_transform *t) {
  if (!t || emi_atomic_dec(&t->refcount) != 0) return;
  em_state *S = t->S;
  if (t->vt->destroy) t->vt->destroy(t);
  emi_free(S, t->impl, t->impl_size);
  emi_free(S, t, sizeof *t);
}

/* custom transforms are named by their creator (below). */
static const emi_transform_vt custom_vt;
typedef struct custom_impl {
  em_sample_fn fn;
  void *ud;
  void (*release)(void *ud);
  char name[64];
} custom_impl;

const char *em_transform_name(const em_transform *t) {
  if (!t) return "(null)";
  if (t->vt == &custom_vt) return ((const custom_impl *)t->impl)->name;
  return t->vt->name;
}

em_status em_transform_apply(em_state *S, em_transform *t, em_tensor **fields,
                             int nfields, uint64_t seed, int64_t index) {
  if (!t) return emi_error(S, EM_ERR_ARG, "transform apply: NULL transform");
  emi_dctx c;
  emi_dctx_init(&c, S, -1, 0);
  emi_drng r;
  emi_drng_init(&r, seed, 0, index);
  em_status st = emi_transform_run(t, &c, &r, fields, nfields);
  if (st) return emi_error(S, st, "%s", c.err);
  return EM_OK;
}

/* -- Helpers shared by the value transforms ----------------------------------------- */

/* fields[0] is a non-empty CPU tensor; returns its shape text in buf for messages. */
static em_status check_field0(emi_dctx *c, const char *op, const em_tensor *x,
                              char *buf) {
  emi_shape_str(buf, x->sizes, x->ndim);
  if (x->device != EM_CPU)
    return emi_dfail(c, EM_ERR_DEVICE, "%s: the image %s is on a CUDA device; "
                     "transforms run on CPU samples", op, buf);
  return EM_OK;
}

/* Puts out in fields[0] in place of the old reference. */
static void replace_field0(em_tensor **fields, em_tensor *out) {
  em_tensor_release(fields[0]);
  fields[0] = out;
}

/* A contiguous copy of x (any strides, any dtype) made in c's state. */
static em_status copy_contiguous(emi_dctx *c, const char *op, em_tensor *x,
                                 em_tensor **out) {
  em_status st = emi_dtensor_new(c, op, x->sizes, x->ndim, x->dtype, out);
  if (st) return st;
  emi_copy_strided(em_tensor_data(*out), x);
  return EM_OK;
}

/* -- to_float ------------------------------------------------------------------------ */

/* uint8 -> float32 / 255 (computed in float32, as torchvision's to_tensor);
** other dtypes converted keeping their values. Any shape. */
static em_status to_float_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                                em_tensor **fields, int nfields) {
  em_tensor *x = fields[0];
  char shp[EMI_SHAPE_STR];
  em_status st = check_field0(c, "to_float", x, shp);
  if (st) return st;
  if (x->dtype == EM_FLOAT32 && em_tensor_is_contiguous(x)) return EM_OK;
  em_tensor *out;
  if ((st = emi_dtensor_new(c, "to_float", x->sizes, x->ndim, EM_FLOAT32, &out)))
    return st;
  em_tensor *ops[2] = {out, x};
  emi_iter it;
  emi_iter_init(&it, ops, 2);
  int64_t ss = it.strides[1][it.ndim - 1];
  float *o = (float *)em_tensor_data(out);   /* rows of out come in order */
  for (int64_t r = 0; r < it.nrows; r++, o += it.inner) {
    char *p[2];
    emi_iter_row(&it, r, p);
    const char *s = p[1];
    if (x->dtype == EM_UINT8) {
      for (int64_t i = 0; i < it.inner; i++)
        o[i] = (float)(uint8_t)s[i * ss] / 255.0f;
    } else if (x->dtype == EM_FLOAT32) {
      for (int64_t i = 0; i < it.inner; i++) o[i] = *(const float *)(s + i * ss);
    } else {
      for (int64_t i = 0; i < it.inner; i++)
        o[i] = (float)emi_load_f64(s + i * ss, x->dtype);
    }
  }
  replace_field0(fields, out);
  return EM_OK;
}

static const emi_transform_vt to_float_vt = {"to_float", to_float_apply, NULL};

em_status em_transform_to_float(em_state *S, em_transform **out) {
  return emi_transform_new(S, &to_float_vt, NULL, 0, out);
}

/* -- normalize ----------------------------------------------------------------------- */

typedef struct normalize_impl {
  int n;
  double mean[];   /* n means, then n stds */
} normalize_impl;

/* x is (C, H, W) or (H, W) (C = 1), floating; out is x's shape and dtype.
** float32 is computed in float32 with the means and stds rounded to float, as
** torchvision's sub_(mean).div_(std) does on a float32 image. */
static em_status normalize_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                                 em_tensor **fields, int nfields) {
  const normalize_impl *nm = t->impl;
  em_tensor *x = fields[0];
  char shp[EMI_SHAPE_STR];
  em_status st = check_field0(c, "normalize", x, shp);
  if (st) return st;
  if (!em_dtype_is_floating(x->dtype))
    return emi_dfail(c, EM_ERR_DTYPE, "normalize: the image %s is %s; normalize needs "
                     "a floating image (put to_float before it)", shp,
                     em_dtype_name(x->dtype));
  if (x->ndim < 2 || x->ndim > 4)
    return emi_dfail(c, EM_ERR_SHAPE, "normalize: expects a (C, H, W) or (H, W) image or a "
                     "(B, C, H, W) batch, got %s", shp);
  /* A batch (after ds:batch) is normalized in one pass: B images of (C, H, W). */
  int64_t B = x->ndim == 4 ? x->sizes[0] : 1, sb = x->ndim == 4 ? x->strides[0] : 0;
  int64_t C = x->ndim >= 3 ? x->sizes[x->ndim - 3] : 1;
  if (nm->n != 1 && nm->n != C)
    return emi_dfail(c, EM_ERR_SHAPE, "normalize: %d means for an image with %lld "
                     "channel%s %s", nm->n, (long long)C, C == 1 ? "" : "s", shp);
  em_tensor *out;
  if ((st = emi_dtensor_new(c, "normalize", x->sizes, x->ndim, x->dtype, &out))) return st;
  int64_t H = x->sizes[x->ndim - 2], W = x->sizes[x->ndim - 1];
  int64_t sc = x->ndim >= 3 ? x->strides[x->ndim - 3] : 0;
  int64_t sh = x->strides[x->ndim - 2], sw = x->strides[x->ndim - 1];
  size_t es = em_dtype_size(x->dtype);
  const char *base = em_tensor_data(x);
  char *o = em_tensor_data(out);
  for (int64_t bc = 0; bc < B * C; bc++) {
    int64_t b = bc / C, ch = bc % C;
    int k = nm->n == 1 ? 0 : (int)ch;
    double m = nm->mean[k], s = nm->mean[nm->n + k];
    for (int64_t y = 0; y < H; y++) {
      const char *src = base + (b * sb + ch * sc + y * sh) * (int64_t)es;
      char *dst = o + (bc * H + y) * W * (int64_t)es;
      if (x->dtype == EM_FLOAT32) {
        float mf = (float)m, sf = (float)s;
        float *d = (float *)dst;
        if (sw == 1) {
          const float *p = (const float *)src;
          for (int64_t i = 0; i < W; i++) d[i] = (p[i] - mf) / sf;
        } else {
          for (int64_t i = 0; i < W; i++) d[i] = (((const float *)src)[i * sw] - mf) / sf;
        }
      } else if (x->dtype == EM_FLOAT64) {
        double *d = (double *)dst;
        for (int64_t i = 0; i < W; i++) d[i] = (((const double *)src)[i * sw] - m) / s;
      } else {   /* float16, bfloat16: in float, rounded once */
        float mf = (float)m, sf = (float)s;
        for (int64_t i = 0; i < W; i++) {
          float v = (float)emi_load_f64(src + i * sw * (int64_t)es, x->dtype);
          emi_store_f64(dst + i * (int64_t)es, x->dtype, (v - mf) / sf);
        }
      }
    }
  }
  replace_field0(fields, out);
  return EM_OK;
}

static const emi_transform_vt normalize_vt = {"normalize", normalize_apply, NULL};

em_status em_transform_normalize(em_state *S, const double *mean, const double *std,
                                 int n, em_transform **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "normalize: NULL out");
  *out = NULL;
  if (!mean || !std || n < 1)
    return emi_error(S, EM_ERR_ARG, "normalize: needs at least one mean and std (got %d)",
                     n);
  for (int k = 0; k < n; k++) {
    if (std[k] == 0 || !isfinite(std[k]) || !isfinite(mean[k]))
      return emi_error(S, EM_ERR_ARG, "normalize: std[%d] = %g, mean[%d] = %g; stds must "
                       "be finite and non-zero, means finite", k + 1, std[k], k + 1,
                       mean[k]);
  }
  size_t sz = sizeof(normalize_impl) + 2 * (size_t)n * sizeof(double);
  normalize_impl *nm = emi_malloc(S, sz);
  if (!nm) return emi_error(S, EM_ERR_NOMEM, "normalize: out of memory");
  nm->n = n;
  memcpy(nm->mean, mean, (size_t)n * sizeof(double));
  memcpy(nm->mean + n, std, (size_t)n * sizeof(double));
  return emi_transform_new(S, &normalize_vt, nm, sz, out);
}

/* -- compose ------------------------------------------------------------------------- */

typedef struct compose_impl {
  int n;
  em_transform *ts[];   /* owned references */
} compose_impl;

/* The children in order on the same fields and the same random stream. */
static em_status compose_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                               em_tensor **fields, int nfields) {
  const compose_impl *cp = t->impl;
  for (int k = 0; k < cp->n; k++) {
    em_status st = emi_transform_run(cp->ts[k], c, rng, fields, nfields);
    if (st) return st;
  }
  return EM_OK;
}

static void compose_destroy(em_transform *t) {
  compose_impl *cp = t->impl;
  if (!cp) return;
  for (int k = 0; k < cp->n; k++) em_transform_release(cp->ts[k]);
}

static const emi_transform_vt compose_vt = {"compose", compose_apply, compose_destroy};

em_status em_transform_compose(em_state *S, em_transform *const *ts, int n,
                               em_transform **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "compose: NULL out");
  *out = NULL;
  if (n < 0 || (n > 0 && !ts))
    return emi_error(S, EM_ERR_ARG, "compose: bad list of %d transforms", n);
  for (int k = 0; k < n; k++)
    if (!ts[k])
      return emi_error(S, EM_ERR_ARG, "compose: transform %d of %d is NULL", k + 1, n);
  size_t sz = sizeof(compose_impl) + (size_t)n * sizeof(em_transform *);
  compose_impl *cp = emi_malloc(S, sz);
  if (!cp) return emi_error(S, EM_ERR_NOMEM, "compose: out of memory");
  cp->n = n;
  for (int k = 0; k < n; k++) {
    em_transform_retain(ts[k]);
    cp->ts[k] = ts[k];
  }
  return emi_transform_new(S, &compose_vt, cp, sz, out);
}

/* -- custom -------------------------------------------------------------------------- */

/* Runs the host function, then replaces every field whose memory belongs to
** another state (a worker's own LuaJIT state makes tensors in its own em_state)
** by a copy in c's state: those tensors must not outlive the call, since the
** worker's state may be closed while a batch is still in use. */
static em_status custom_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                              em_tensor **fields, int nfields) {
  const custom_impl *cu = t->impl;
  c->err[0] = 0;
  uint64_t seed = 0;
  if (rng) seed = (uint64_t)emi_drng_u32(rng) << 32 | emi_drng_u32(rng);
  int rc = cu->fn(cu->ud, c->worker, seed, fields, nfields, c->err, sizeof c->err);
  c->err[sizeof c->err - 1] = 0;
  em_status st = EM_OK;
  if (rc) {
    if (!c->err[0]) emi_dfail(c, EM_ERR_ARG, "%s: failed (returned %d)", cu->name, rc);
    st = EM_ERR_ARG;
  }
  for (int k = 0; k < nfields; k++) {
    em_tensor *f = fields[k];
    if (!f) {
      if (!st) st = emi_dfail(c, EM_ERR_ARG, "%s: left field %d of the sample NULL",
                              cu->name, k + 1);
      continue;
    }
    if (f->storage->S == c->S) continue;
    /* After a failure, a foreign tensor is dropped rather than copied. */
    em_tensor *copy = NULL;
    if (!st && f->device != EM_CPU)
      st = emi_dfail(c, EM_ERR_DEVICE, "%s: field %d is on a CUDA device of another "
                     "state; return CPU tensors from a sample function", cu->name, k + 1);
    else if (!st)
      st = copy_contiguous(c, cu->name, f, &copy);
    em_tensor_release(f);
    fields[k] = copy;
  }
  return st;
}

static void custom_destroy(em_transform *t) {
  custom_impl *cu = t->impl;
  if (cu && cu->release) cu->release(cu->ud);
}

static const emi_transform_vt custom_vt = {"custom", custom_apply, custom_destroy};

/* ud belongs to the transform from here on: when it can't be made, release(ud)
** runs at once, so that the caller never has to tell the cases apart. */
em_status em_transform_custom(em_state *S, const char *name, em_sample_fn fn, void *ud,
                              void (*release)(void *ud), em_transform **out) {
  if (out) *out = NULL;
  if (!out || !fn) {
    if (release) release(ud);
    return emi_error(S, EM_ERR_ARG, "custom transform %s: NULL %s",
                     name ? name : "(unnamed)", out ? "function" : "out");
  }
  custom_impl *cu = emi_malloc(S, sizeof *cu);
  if (!cu) {
    if (release) release(ud);
    return emi_error(S, EM_ERR_NOMEM, "custom transform: out of memory");
  }
  cu->fn = fn;
  cu->ud = ud;
  cu->release = release;
  snprintf(cu->name, sizeof cu->name, "%s", name && *name ? name : "custom");
  return emi_transform_new(S, &custom_vt, cu, sizeof *cu, out);
}
