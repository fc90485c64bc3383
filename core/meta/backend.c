/*
** backend.c -- the meta device's op table: tensors with shapes and dtypes and no
** data. ops/ do all the work that does not touch data -- checks, type
** promotion, shapes, autograd's recording and its backward graph -- and then
** call this table, whose entries do nothing: so a model's forward and backward
** on meta run every check of the real step and count, through alloc, the bytes
** it would hold (em_device_memory(S, EM_META)), and cost microseconds.
**
** Storages are headers with no data. Copying onto meta succeeds from any
** device (that is m:to('meta')); reading a meta tensor's values -- copying it
** to another device, item(), printing -- is an error that says so.
*/
#include "internal.h"

static emi_storage *meta_alloc(emi_device *d, size_t nbytes) {
  emi_storage *st = emi_malloc(d->S, sizeof *st);
  if (!st) return NULL;
  memset(st, 0, sizeof *st);
  st->nbytes = nbytes;
  st->block_size = sizeof *st;
  return st;
}

static void meta_free(emi_device *d, emi_storage *st) { emi_free(d->S, st, sizeof *st); }

/* Onto meta: nothing to move. Off meta: there are no values to read. */
static em_status meta_copy(emi_device *d, em_tensor *out, const em_tensor *src) {
  if (out->device == EM_META) return EM_OK;
  char b[32];
  return emi_error(d->S, EM_ERR_DEVICE, "can't read the values of a meta tensor (shape %s, "
                   "%s) into %s: a meta tensor has a shape and a dtype but no data",
                   emi_tshape(d->S, src), em_dtype_name(src->dtype),
                   emi_device_name(b, out->device));
}

/* Every other entry: the op's checks and shapes ran in ops/; there is no data. */
static em_status meta_fill(emi_device *d, em_tensor *out, double value) {
  return EM_OK;
}

static em_status meta_unary(emi_device *d, em_unop op, em_tensor *out,
                            const em_tensor *a) {
  return EM_OK;
}

static em_status meta_binary(emi_device *d, em_binop op, em_tensor *out,
                             const em_tensor *a, const em_tensor *b) {
  return EM_OK;
}

static em_status meta_binary_scalar(emi_device *d, em_binop op, em_tensor *out,
                                    const em_tensor *a, double s, int reverse) {
  return EM_OK;
}

static em_status meta_add_scaled(emi_device *d, em_tensor *out, const em_tensor *a,
                                 const em_tensor *b, double alpha) {
  return EM_OK;
}

static em_status meta_clamp(emi_device *d, em_tensor *out, const em_tensor *a, double lo,
                            double hi) {
  return EM_OK;
}

static em_status meta_where(emi_device *d, em_tensor *out, const em_tensor *cond,
                            const em_tensor *a, const em_tensor *b) {
  return EM_OK;
}

static em_status meta_reduce(emi_device *d, em_redop op, em_tensor *out,
                             const em_tensor *a, unsigned mask) {
  return EM_OK;
}

static em_status meta_var(emi_device *d, em_tensor *out, const em_tensor *a,
                          unsigned mask, double correction, int take_sqrt) {
  return EM_OK;
}

static em_status meta_norm(emi_device *d, em_tensor *out, const em_tensor *a,
                           unsigned mask, double p) {
  return EM_OK;
}

static em_status meta_arg_reduce(emi_device *d, em_tensor *values, em_tensor *indices,
                                 const em_tensor *a, int dim, int want_max,
                                 int index_base) {
  return EM_OK;
}

static em_status meta_softmax(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                              int log) {
  return EM_OK;
}

static em_status meta_matmul(emi_device *d, em_tensor *out, const em_tensor *a,
                             const em_tensor *b) {
  return EM_OK;
}

static em_status meta_index_select(emi_device *d, em_tensor *out, const em_tensor *a,
                                   int dim, const em_tensor *idx, int index_base) {
  return EM_OK;
}

static em_status meta_gather(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                             const em_tensor *idx, int index_base) {
  return EM_OK;
}

static em_status meta_uniform(emi_device *d, em_tensor *out, uint64_t seed,
                              uint64_t offset, double lo, double hi) {
  return EM_OK;
}

static em_status meta_normal(emi_device *d, em_tensor *out, uint64_t seed,
                             uint64_t offset, double mean, double std) {
  return EM_OK;
}

static em_status meta_randint(emi_device *d, em_tensor *out, uint64_t seed,
                              uint64_t offset, int64_t lo, int64_t hi) {
  return EM_OK;
}

static em_status meta_arange(emi_device *d, em_tensor *out, double start, double step) {
  return EM_OK;
}

static em_status meta_conv2d(emi_device *d, const emi_conv_geom *g, em_tensor *y,
                             const em_tensor *x, const em_tensor *w, const em_tensor *b) {
  return EM_OK;
}

static em_status meta_conv2d_backward(emi_device *d, const emi_conv_geom *g,
                                      em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                      const em_tensor *gy, const em_tensor *x,
                                      const em_tensor *w) {
  return EM_OK;
}

static em_status meta_max_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                                 em_tensor *ind, const em_tensor *x, int index_base) {
  return EM_OK;
}

static em_status meta_max_pool2d_backward(emi_device *d, const emi_pool_geom *g,
                                          em_tensor *gx, const em_tensor *gy,
                                          const em_tensor *ind, int index_base) {
  return EM_OK;
}

static em_status meta_avg_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                                 const em_tensor *x, int count_include_pad) {
  return EM_OK;
}

static em_status meta_avg_pool2d_backward(emi_device *d, const emi_pool_geom *g,
                                          em_tensor *gx, const em_tensor *gy,
                                          int count_include_pad) {
  return EM_OK;
}

static em_status meta_adaptive_avg_pool2d(emi_device *d, const emi_pool_geom *g,
                                          em_tensor *y, const em_tensor *x) {
  return EM_OK;
}

static em_status meta_adaptive_avg_pool2d_backward(emi_device *d, const emi_pool_geom *g,
                                                   em_tensor *gx, const em_tensor *gy) {
  return EM_OK;
}

static em_status meta_batch_norm(emi_device *d, em_tensor *y, em_tensor *mean,
                                 em_tensor *invstd, em_tensor *running_mean,
                                 em_tensor *running_var, const em_tensor *x,
                                 const em_tensor *w, const em_tensor *b, int training,
                                 double momentum, double eps) {
  return EM_OK;
}

static em_status meta_batch_norm_backward(emi_device *d, em_tensor *gx, em_tensor *gw,
                                          em_tensor *gb, const em_tensor *gy,
                                          const em_tensor *x, const em_tensor *mean,
                                          const em_tensor *invstd, const em_tensor *w,
                                          int training) {
  return EM_OK;
}

static em_status meta_layer_norm(emi_device *d, em_tensor *y, em_tensor *mean,
                                 em_tensor *rstd, const em_tensor *x, const em_tensor *w,
                                 const em_tensor *b, double eps) {
  return EM_OK;
}

static em_status meta_layer_norm_backward(emi_device *d, em_tensor *gx, em_tensor *gw,
                                          em_tensor *gb, const em_tensor *gy,
                                          const em_tensor *x, const em_tensor *mean,
                                          const em_tensor *rstd, const em_tensor *w) {
  return EM_OK;
}

static em_status meta_cross_entropy(emi_device *d, em_tensor *loss, em_tensor *lse,
                                    const em_tensor *x, const em_tensor *target,
                                    int index_base, int64_t ignore_index,
                                    double label_smoothing, int reduction) {
  return EM_OK;
}

static em_status meta_cross_entropy_backward(emi_device *d, em_tensor *gx,
                                             const em_tensor *grad_loss,
                                             const em_tensor *x, const em_tensor *target,
                                             const em_tensor *lse, int index_base,
                                             int64_t ignore_index, double label_smoothing,
                                             int reduction) {
  return EM_OK;
}

static em_status meta_nll_loss(emi_device *d, em_tensor *loss, const em_tensor *logp,
                               const em_tensor *target, int index_base,
                               int64_t ignore_index, int reduction) {
  return EM_OK;
}

static em_status meta_nll_loss_backward(emi_device *d, em_tensor *gx,
                                        const em_tensor *grad_loss,
                                        const em_tensor *target, int index_base,
                                        int64_t ignore_index, int reduction) {
  return EM_OK;
}

static em_status meta_pointwise_loss(emi_device *d, int kind, em_tensor *loss,
                                     const em_tensor *x, const em_tensor *y,
                                     int reduction) {
  return EM_OK;
}

static em_status meta_pointwise_loss_backward(emi_device *d, int kind, em_tensor *gx,
                                              const em_tensor *grad_loss,
                                              const em_tensor *x, const em_tensor *y,
                                              int reduction) {
  return EM_OK;
}

static em_status meta_index_add(emi_device *d, em_tensor *out, int dim,
                                const em_tensor *idx, const em_tensor *src,
                                int index_base) {
  return EM_OK;
}

static em_status meta_scatter_add(emi_device *d, em_tensor *out, int dim,
                                  const em_tensor *idx, const em_tensor *src,
                                  int index_base) {
  return EM_OK;
}

static em_status meta_sgd_step_multi(emi_device *d, int n, em_tensor *const *p,
                                     const em_tensor *const *g, em_tensor *const *buf,
                                     const int *first, double lr, double momentum,
                                     double dampening, double wd, int nesterov) {
  return EM_OK;
}

static em_status meta_adam_step_multi(emi_device *d, int n, em_tensor *const *p,
                                      const em_tensor *const *g, em_tensor *const *m,
                                      em_tensor *const *v, const double *step_size,
                                      const double *bc2_sqrt, double beta1, double beta2,
                                      double eps, double wd, double decay) {
  return EM_OK;
}

static em_status meta_norm_multi(emi_device *d, em_tensor *out, int n,
                                 const em_tensor *const *t, double p) {
  return EM_OK;
}

static em_status meta_scale_multi(emi_device *d, int n, em_tensor *const *t,
                                  double scale) {
  return EM_OK;
}

static em_status meta_sort(emi_device *d, em_tensor *indices, const em_tensor *a, int dim,
                           int descending, int index_base, int64_t k) {
  return EM_OK;
}

static em_status meta_scan(emi_device *d, int op, em_tensor *out, const em_tensor *a,
                           int dim) {
  return EM_OK;
}

const emi_backend emi_meta_backend = {
  .name = "meta",
  .id = EMI_BACKEND_META,
  .alloc = meta_alloc,
  .free = meta_free,
  .copy = meta_copy,
  .fill = meta_fill,
  .unary = meta_unary,
  .binary = meta_binary,
  .binary_scalar = meta_binary_scalar,
  .add_scaled = meta_add_scaled,
  .clamp = meta_clamp,
  .where = meta_where,
  .reduce = meta_reduce,
  .var = meta_var,
  .norm = meta_norm,
  .arg_reduce = meta_arg_reduce,
  .softmax = meta_softmax,
  .matmul = meta_matmul,
  .index_select = meta_index_select,
  .gather = meta_gather,
  .uniform = meta_uniform,
  .normal = meta_normal,
  .randint = meta_randint,
  .arange = meta_arange,
  .conv2d = meta_conv2d,
  .conv2d_backward = meta_conv2d_backward,
  .max_pool2d = meta_max_pool2d,
  .max_pool2d_backward = meta_max_pool2d_backward,
  .avg_pool2d = meta_avg_pool2d,
  .avg_pool2d_backward = meta_avg_pool2d_backward,
  .adaptive_avg_pool2d = meta_adaptive_avg_pool2d,
  .adaptive_avg_pool2d_backward = meta_adaptive_avg_pool2d_backward,
  .batch_norm = meta_batch_norm,
  .batch_norm_backward = meta_batch_norm_backward,
  .layer_norm = meta_layer_norm,
  .layer_norm_backward = meta_layer_norm_backward,
  .cross_entropy = meta_cross_entropy,
  .cross_entropy_backward = meta_cross_entropy_backward,
  .nll_loss = meta_nll_loss,
  .nll_loss_backward = meta_nll_loss_backward,
  .pointwise_loss = meta_pointwise_loss,
  .pointwise_loss_backward = meta_pointwise_loss_backward,
  .index_add = meta_index_add,
  .scatter_add = meta_scatter_add,
  .sgd_step_multi = meta_sgd_step_multi,
  .adam_step_multi = meta_adam_step_multi,
  .norm_multi = meta_norm_multi,
  .scale_multi = meta_scale_multi,
  .sort = meta_sort,
  .scan = meta_scan,
};
