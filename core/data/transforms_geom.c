/*
** transforms_geom.c -- the geometric transforms: random_crop (with zero
** padding), center_crop, resize (bilinear), hflip and cutout. Each follows
** torchvision 0.14 where it defines the behaviour, so a pipeline ported from
** PyTorch gives the same images; the comments on each say where it differs.
**
** They act on field 0, an image (C, H, W) or (H, W) of any dtype (resize:
** uint8 or floating) and any strides, and put a new contiguous image in its
** place. Crops and flips move whole elements, so they run by element size with
** memcpy for rows whose source is contiguous; resize precomputes its index and
** weight tables per call and works in two separable passes. Random draws come
** only from the stream passed in, in a fixed order per transform, so a sample's
** result depends only on (seed, epoch, index).
*/
#include "data.h"
#include <math.h>

/* -- The image in field 0 --------------------------------------------------------- */

typedef struct image {
  em_tensor *t;
  int ndim;                  /* 2 or 3 */
  int64_t C, H, W;           /* C = 1 for (H, W) */
  int64_t sc, sh, sw;        /* strides in bytes */
  size_t es;                 /* element size */
  const char *data;
  char shape[EMI_SHAPE_STR]; /* "[3,32,32]" for messages */
} image;

static em_status image_of(emi_dctx *c, const char *op, em_tensor *x, image *m) {
  m->t = x;
  emi_shape_str(m->shape, x->sizes, x->ndim);
  if (x->device != EM_CPU)
    return emi_dfail(c, EM_ERR_DEVICE, "%s: the image %s is on a CUDA device; "
                     "transforms run on CPU samples", op, m->shape);
  if (x->ndim != 2 && x->ndim != 3)
    return emi_dfail(c, EM_ERR_SHAPE, "%s: expects a (C, H, W) or (H, W) image, got %s",
                     op, m->shape);
  if (x->numel == 0)
    return emi_dfail(c, EM_ERR_SHAPE, "%s: the image %s is empty", op, m->shape);
  m->ndim = x->ndim;
  m->es = em_dtype_size(x->dtype);
  int d = x->ndim - 2;
  m->C = d ? x->sizes[0] : 1;
  m->sc = d ? x->strides[0] * (int64_t)m->es : 0;
  m->H = x->sizes[d];
  m->W = x->sizes[d + 1];
  m->sh = x->strides[d] * (int64_t)m->es;
  m->sw = x->strides[d + 1] * (int64_t)m->es;
  m->data = em_tensor_data(x);
  return EM_OK;
}

/* A new contiguous image with m's channels and dtype, h x w. */
static em_status image_new(emi_dctx *c, const char *op, const image *m, int64_t h,
                           int64_t w, em_tensor **out) {
  int64_t sizes[3] = {m->C, h, w};
  return m->ndim == 3 ? emi_dtensor_new(c, op, sizes, 3, m->t->dtype, out)
                      : emi_dtensor_new(c, op, sizes + 1, 2, m->t->dtype, out);
}

static void replace_field0(em_tensor **fields, em_tensor *out) {
  em_tensor_release(fields[0]);
  fields[0] = out;
}

static em_status need_rng(emi_dctx *c, const char *op, emi_drng *rng) {
  return rng ? EM_OK : emi_dfail(c, EM_ERR_ARG, "%s: is random and needs a random "
                                 "stream (none given)", op);
}

/* -- Crop with zero padding ----------------------------------------------------------
** out[ch, y, x] = m[ch, top + y, left + x], or 0 where that is outside the image
** (top and left may be negative: padding). out is (C, h, w) contiguous. */
static void crop_pad(const image *m, int64_t top, int64_t left, int64_t h, int64_t w,
                     char *out) {
  size_t es = m->es;
  size_t row = (size_t)w * es;
  /* The columns [x0, x1) of each output row come from the image. */
  int64_t x0 = left < 0 ? -left : 0;
  int64_t x1 = m->W - left < w ? m->W - left : w;
  if (x1 < x0) x1 = x0;
  for (int64_t ch = 0; ch < m->C; ch++) {
    for (int64_t y = 0; y < h; y++, out += row) {
      int64_t sy = top + y;
      if (sy < 0 || sy >= m->H || x1 == x0) {
        memset(out, 0, row);
        continue;
      }
      if (x0 > 0) memset(out, 0, (size_t)x0 * es);
      emi_copy_row(out + x0 * es, m->data + ch * m->sc + sy * m->sh + (left + x0) * m->sw,
                   x1 - x0, m->sw, es);
      if (x1 < w) memset(out + x1 * es, 0, (size_t)(w - x1) * es);
    }
  }
}

typedef struct crop_impl {
  int64_t h, w, pad;
} crop_impl;

/* torchvision's RandomCrop(size, padding) with fill 0: pad every side, then
** top = below(H + 2p - h + 1) and left = below(W + 2p - w + 1), drawn in that order. */
static em_status random_crop_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                                   em_tensor **fields, int nfields) {
  const crop_impl *cr = t->impl;
  image m;
  em_status st = image_of(c, "random_crop", fields[0], &m);
  if (st || (st = need_rng(c, "random_crop", rng))) return st;
  int64_t hp = m.H + 2 * cr->pad, wp = m.W + 2 * cr->pad;
  if (cr->h > hp || cr->w > wp)
    return emi_dfail(c, EM_ERR_SHAPE, "random_crop: crop %lldx%lld larger than the padded "
                     "image %lldx%lld (padding %lld; image %s)", (long long)cr->h,
                     (long long)cr->w, (long long)hp, (long long)wp, (long long)cr->pad,
                     m.shape);
  int64_t top = emi_drng_below(rng, hp - cr->h + 1);
  int64_t left = emi_drng_below(rng, wp - cr->w + 1);
  em_tensor *out;
  if ((st = image_new(c, "random_crop", &m, cr->h, cr->w, &out))) return st;
  crop_pad(&m, top - cr->pad, left - cr->pad, cr->h, cr->w, em_tensor_data(out));
  replace_field0(fields, out);
  return EM_OK;
}

/* Python's round((size - crop) / 2.0) for size >= crop: halves go to even. */
static int64_t center_offset(int64_t size, int64_t crop) {
  if (crop > size) return -((crop - size) / 2);   /* padded: (crop - size) // 2 before */
  int64_t d = size - crop, k = d / 2;
  return (d & 1) && (k & 1) ? k + 1 : k;
}

/* torchvision's center_crop: a dim smaller than the crop is zero-padded by
** (crop - size) // 2 before and the rest after; the other dims are cropped at
** round((size - crop) / 2). */
static em_status center_crop_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                                   em_tensor **fields, int nfields) {
  const crop_impl *cr = t->impl;
  image m;
  em_status st = image_of(c, "center_crop", fields[0], &m);
  if (st) return st;
  em_tensor *out;
  if ((st = image_new(c, "center_crop", &m, cr->h, cr->w, &out))) return st;
  crop_pad(&m, center_offset(m.H, cr->h), center_offset(m.W, cr->w), cr->h, cr->w,
           em_tensor_data(out));
  replace_field0(fields, out);
  return EM_OK;
}

static const emi_transform_vt random_crop_vt = {"random_crop", random_crop_apply, NULL};
static const emi_transform_vt center_crop_vt = {"center_crop", center_crop_apply, NULL};

static em_status new_crop(em_state *S, const emi_transform_vt *vt, int64_t h, int64_t w,
                          int64_t pad, em_transform **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: NULL out", vt->name);
  *out = NULL;
  if (h < 1 || w < 1 || pad < 0 || h > ((int64_t)1 << 31) || w > ((int64_t)1 << 31) ||
      pad > ((int64_t)1 << 30))
    return emi_error(S, EM_ERR_ARG, "%s: size %lldx%lld, padding %lld; sizes must be "
                     ">= 1 and padding >= 0", vt->name, (long long)h, (long long)w,
                     (long long)pad);
  crop_impl *cr = emi_malloc(S, sizeof *cr);
  if (!cr) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", vt->name);
  cr->h = h;
  cr->w = w;
  cr->pad = pad;
  return emi_transform_new(S, vt, cr, sizeof *cr, out);
}

em_status em_transform_random_crop(em_state *S, int64_t height, int64_t width,
                                   int64_t padding, em_transform **out) {
  return new_crop(S, &random_crop_vt, height, width, padding, out);
}

em_status em_transform_center_crop(em_state *S, int64_t height, int64_t width,
                                   em_transform **out) {
  return new_crop(S, &center_crop_vt, height, width, 0, out);
}

/* -- resize --------------------------------------------------------------------------
** Bilinear with half-pixel centres and no antialiasing: PyTorch's
** interpolate(mode='bilinear', align_corners=False), which torchvision's resize
** of a tensor uses. For output index i along a dim of input size n and output
** size o: src = max(0, (n / o) * (i + 0.5) - 0.5), i0 = floor(src), i1 = i0 + 1
** (i0 at the last row), weights 1 - (src - i0) and src - i0. As PyTorch 1.13's
** CPU kernel does (so that results agree bit for bit, which matters for uint8
** ties): n / o in the image's float type, src in double (one fused
** multiply-add, as the compiler makes of PyTorch's expression), the weights
** rounded to the image's type; along W first, then along H, each step a fused multiply-add
** a = fma(x0, w0, x1 * w1). float32 and uint8 images are computed in float,
** float64 ones in double. uint8 results are rounded half to even (torch.round,
** as torchvision does) and clamped to 0..255. (PyTorch takes another path for
** one-channel float images, whose last bits may differ from these.) */

/* fmaf is one instruction where the build targets FMA hardware (-march=native
** on any x86 since 2013), a correct but slow library call elsewhere. */
#define FMAF(a, b, c) fmaf(a, b, c)
#define FMA(a, b, c) fma(a, b, c)

typedef struct resize_impl {
  int64_t h, w;
} resize_impl;

/* The tables for one dim: tap offsets (stride applied) and weights. */
#define DEF_TABLE(NAME, T, I) \
  static void NAME(int64_t n, int64_t o, int64_t stride, I *i0, I *i1, T *w0, T *w1) { \
    T scale = (T)n / (T)o; \
    for (int64_t i = 0; i < o; i++) { \
      double src = fma((double)scale, (double)i + 0.5, -0.5); \
      if (src < 0) src = 0; \
      int64_t k = (int64_t)src; \
      if (k > n - 1) k = n - 1; \
      T l1 = (T)(src - (double)k); \
      i0[i] = (I)(k * stride); \
      i1[i] = (I)((k < n - 1 ? k + 1 : k) * stride); \
      w1[i] = l1; \
      w0[i] = (T)1 - l1; \
    } \
  }
DEF_TABLE(table_f32, float, int64_t)
DEF_TABLE(table_f32_i32, float, int32_t)
DEF_TABLE(table_f64, double, int64_t)

/* One image row along W: tmp[i] = fma(r[i0[i]], w0[i], r[i1[i]] * w1[i]) where
** r is the row as contiguous floats (so that the gathers vectorize). */
static void hpass_f32(const char *row, em_dtype dt, int64_t W, int64_t sw, float *r,
                      int64_t o, const int32_t *i0, const int32_t *i1, const float *w0,
                      const float *w1, float *tmp) {
  if (dt == EM_UINT8) {
    const uint8_t *s = (const uint8_t *)row;
    if (sw == 1)
      for (int64_t i = 0; i < W; i++) r[i] = (float)s[i];
    else
      for (int64_t i = 0; i < W; i++) r[i] = (float)s[i * sw];
  } else {
    emi_copy_row((char *)r, row, W, sw * (int64_t)sizeof(float), sizeof(float));
  }
  for (int64_t i = 0; i < o; i++) tmp[i] = FMAF(r[i0[i]], w0[i], r[i1[i]] * w1[i]);
}

static void hpass_f64(const char *row, int64_t o, const int64_t *i0, const int64_t *i1,
                      const double *w0, const double *w1, double *tmp) {
  for (int64_t i = 0; i < o; i++)
    tmp[i] = FMA(*(const double *)(row + i0[i]), w0[i],
                 *(const double *)(row + i1[i]) * w1[i]);
}

/* Bytes of scratch memory resize_f32 / resize_f64 need. */
static size_t resize_scratch(em_dtype dt, int64_t W, int64_t oh, int64_t ow) {
  if (dt == EM_FLOAT64)
    return (size_t)(2 * oh + 2 * ow) * (sizeof(int64_t) + sizeof(double)) +
           (size_t)(2 * ow) * sizeof(double);
  return (size_t)(2 * oh) * (sizeof(int64_t) + sizeof(float)) +
         (size_t)(2 * ow) * (sizeof(int32_t) + 2 * sizeof(float)) + (size_t)W * sizeof(float);
}

/* m is (C, H, W) uint8 or float32; out is (C, oh, ow) of the same dtype. */
static void resize_f32(const image *m, int64_t oh, int64_t ow, char *scratch, char *out) {
  int64_t *y0 = (int64_t *)scratch, *y1 = y0 + oh;
  int32_t *x0 = (int32_t *)(y1 + oh), *x1 = x0 + ow;
  float *wy0 = (float *)(x1 + ow), *wy1 = wy0 + oh, *wx0 = wy1 + oh, *wx1 = wx0 + ow;
  float *ta = wx1 + ow, *tb = ta + ow, *rowf = tb + ow;
  table_f32(m->H, oh, m->sh, y0, y1, wy0, wy1);
  table_f32_i32(m->W, ow, 1, x0, x1, wx0, wx1);
  em_dtype dt = m->t->dtype;
  int64_t sw = m->sw / (int64_t)m->es;
  for (int64_t ch = 0; ch < m->C; ch++) {
    const char *img = m->data + ch * m->sc;
    int64_t ra = -1, rb = -1;   /* the rows (byte offsets) ta and tb hold */
    for (int64_t y = 0; y < oh; y++) {
      /* Row offsets only grow with y, so each input row is interpolated once. */
      if (ra != y0[y]) {
        if (rb == y0[y]) {
          float *s = ta; ta = tb; tb = s;
          ra = rb;
          rb = -1;
        } else {
          hpass_f32(img + y0[y], dt, m->W, sw, rowf, ow, x0, x1, wx0, wx1, ta);
          ra = y0[y];
        }
      }
      if (rb != y1[y]) {
        hpass_f32(img + y1[y], dt, m->W, sw, rowf, ow, x0, x1, wx0, wx1, tb);
        rb = y1[y];
      }
      float a = wy0[y], b = wy1[y];
      if (dt == EM_UINT8) {
        uint8_t *o = (uint8_t *)out + (ch * oh + y) * ow;
        for (int64_t i = 0; i < ow; i++) {
          float v = nearbyintf(FMAF(ta[i], a, tb[i] * b));
          o[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
      } else {
        float *o = (float *)out + (ch * oh + y) * ow;
        for (int64_t i = 0; i < ow; i++) o[i] = FMAF(ta[i], a, tb[i] * b);
      }
    }
  }
}

/* The same in double for float64 images (no row reuse: this is not a hot path). */
static void resize_f64(const image *m, int64_t oh, int64_t ow, char *scratch, char *out) {
  int64_t *y0 = (int64_t *)scratch, *y1 = y0 + oh, *x0 = y1 + oh, *x1 = x0 + ow;
  double *wy0 = (double *)(x1 + ow), *wy1 = wy0 + oh, *wx0 = wy1 + oh, *wx1 = wx0 + ow;
  double *ta = wx1 + ow, *tb = ta + ow;
  table_f64(m->H, oh, m->sh, y0, y1, wy0, wy1);
  table_f64(m->W, ow, m->sw, x0, x1, wx0, wx1);
  for (int64_t ch = 0; ch < m->C; ch++) {
    const char *img = m->data + ch * m->sc;
    for (int64_t y = 0; y < oh; y++) {
      hpass_f64(img + y0[y], ow, x0, x1, wx0, wx1, ta);
      hpass_f64(img + y1[y], ow, x0, x1, wx0, wx1, tb);
      double *o = (double *)out + (ch * oh + y) * ow;
      for (int64_t i = 0; i < ow; i++) o[i] = FMA(ta[i], wy0[y], tb[i] * wy1[y]);
    }
  }
}

static em_status resize_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                              em_tensor **fields, int nfields) {
  const resize_impl *rs = t->impl;
  image m;
  em_status st = image_of(c, "resize", fields[0], &m);
  if (st) return st;
  em_dtype dt = m.t->dtype;
  if (dt != EM_UINT8 && dt != EM_FLOAT32 && dt != EM_FLOAT64)
    return emi_dfail(c, EM_ERR_DTYPE, "resize: the image %s is %s; resize takes uint8, "
                     "float32 or float64 images", m.shape, em_dtype_name(dt));
  if (m.H == rs->h && m.W == rs->w && em_tensor_is_contiguous(m.t))
    return EM_OK;   /* the identity: every weight is exactly (1, 0) */
  if (m.W > INT32_MAX)
    return emi_dfail(c, EM_ERR_SHAPE, "resize: the image %s is too wide", m.shape);
  size_t nscratch = resize_scratch(dt, m.W, rs->h, rs->w);
  char *scratch = emi_malloc(c->S, nscratch);
  if (!scratch)
    return emi_dfail(c, EM_ERR_NOMEM, "resize: out of memory for %s to %lldx%lld",
                     m.shape, (long long)rs->h, (long long)rs->w);
  em_tensor *out;
  if ((st = image_new(c, "resize", &m, rs->h, rs->w, &out))) {
    emi_free(c->S, scratch, nscratch);
    return st;
  }
  if (dt == EM_FLOAT64)
    resize_f64(&m, rs->h, rs->w, scratch, em_tensor_data(out));
  else
    resize_f32(&m, rs->h, rs->w, scratch, em_tensor_data(out));
  emi_free(c->S, scratch, nscratch);
  replace_field0(fields, out);
  return EM_OK;
}

static const emi_transform_vt resize_vt = {"resize", resize_apply, NULL};

em_status em_transform_resize(em_state *S, int64_t height, int64_t width,
                              em_transform **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "resize: NULL out");
  *out = NULL;
  if (height < 1 || width < 1 || height > ((int64_t)1 << 24) || width > ((int64_t)1 << 24))
    return emi_error(S, EM_ERR_ARG, "resize: size %lldx%lld; sizes must be 1 .. 2^24",
                     (long long)height, (long long)width);
  resize_impl *rs = emi_malloc(S, sizeof *rs);
  if (!rs) return emi_error(S, EM_ERR_NOMEM, "resize: out of memory");
  rs->h = height;
  rs->w = width;
  return emi_transform_new(S, &resize_vt, rs, sizeof *rs, out);
}

/* -- hflip ----------------------------------------------------------------------------
** One uniform draw per sample, always (so the stream stays aligned whatever
** the outcome): flipped when it is < p. An unflipped image is kept as it is. */

typedef struct hflip_impl {
  double p;
} hflip_impl;

/* dst[i] = src[(n - 1 - i) * ss]: a copy walking the row backwards. */
static void reverse_elems(char *dst, const char *src, int64_t n, int64_t ss, size_t es) {
  if (n > 0) emi_copy_row(dst, src + (n - 1) * ss, n, -ss, es);
}

static em_status hflip_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                             em_tensor **fields, int nfields) {
  const hflip_impl *hf = t->impl;
  image m;
  em_status st = image_of(c, "hflip", fields[0], &m);
  if (st || (st = need_rng(c, "hflip", rng))) return st;
  if (!(emi_drng_uniform(rng) < hf->p)) return EM_OK;
  em_tensor *out;
  if ((st = image_new(c, "hflip", &m, m.H, m.W, &out))) return st;
  char *o = em_tensor_data(out);
  size_t row = (size_t)m.W * m.es;
  for (int64_t ch = 0; ch < m.C; ch++)
    for (int64_t y = 0; y < m.H; y++, o += row)
      reverse_elems(o, m.data + ch * m.sc + y * m.sh, m.W, m.sw, m.es);
  replace_field0(fields, out);
  return EM_OK;
}

static const emi_transform_vt hflip_vt = {"hflip", hflip_apply, NULL};

em_status em_transform_hflip(em_state *S, double p, em_transform **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "hflip: NULL out");
  *out = NULL;
  if (!(p >= 0 && p <= 1))
    return emi_error(S, EM_ERR_ARG, "hflip: probability %g is not in [0, 1]", p);
  hflip_impl *hf = emi_malloc(S, sizeof *hf);
  if (!hf) return emi_error(S, EM_ERR_NOMEM, "hflip: out of memory");
  hf->p = p;
  return emi_transform_new(S, &hflip_vt, hf, sizeof *hf, out);
}

/* -- cutout ---------------------------------------------------------------------------
** DeVries & Taylor (2017): a centre (cy, cx) = (below(H), below(W)), drawn in
** that order, and the square rows [cy - size/2, cy - size/2 + size) and the
** same columns, clipped to the image, zeroed in every channel. (Their code
** zeroes 2 * (size / 2) rows, one fewer for odd sizes; here it is always size.) */

typedef struct cutout_impl {
  int64_t size;
} cutout_impl;

static em_status cutout_apply(em_transform *t, emi_dctx *c, emi_drng *rng,
                              em_tensor **fields, int nfields) {
  const cutout_impl *cu = t->impl;
  image m;
  em_status st = image_of(c, "cutout", fields[0], &m);
  if (st || (st = need_rng(c, "cutout", rng))) return st;
  int64_t cy = emi_drng_below(rng, m.H), cx = emi_drng_below(rng, m.W);
  int64_t ya = cy - cu->size / 2, xa = cx - cu->size / 2;
  int64_t yb = ya + cu->size, xb = xa + cu->size;
  if (ya < 0) ya = 0;
  if (xa < 0) xa = 0;
  if (yb > m.H) yb = m.H;
  if (xb > m.W) xb = m.W;
  em_tensor *out;
  if ((st = image_new(c, "cutout", &m, m.H, m.W, &out))) return st;
  char *o = em_tensor_data(out);
  crop_pad(&m, 0, 0, m.H, m.W, o);   /* a contiguous copy */
  for (int64_t ch = 0; ch < m.C; ch++)
    for (int64_t y = ya; y < yb; y++)
      memset(o + ((ch * m.H + y) * m.W + xa) * (int64_t)m.es, 0,
             (size_t)(xb - xa) * m.es);
  replace_field0(fields, out);
  return EM_OK;
}

static const emi_transform_vt cutout_vt = {"cutout", cutout_apply, NULL};

em_status em_transform_cutout(em_state *S, int64_t size, em_transform **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "cutout: NULL out");
  *out = NULL;
  if (size < 1 || size > ((int64_t)1 << 31))
    return emi_error(S, EM_ERR_ARG, "cutout: size %lld; it must be >= 1", (long long)size);
  cutout_impl *cu = emi_malloc(S, sizeof *cu);
  if (!cu) return emi_error(S, EM_ERR_NOMEM, "cutout: out of memory");
  cu->size = size;
  return emi_transform_new(S, &cutout_vt, cu, sizeof *cu, out);
}
