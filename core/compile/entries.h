/*
** entries.h -- the argument lists of the backend entries a compiled step
** records (emi_backend's, backend.h, restated as F(type, name) lists), and the
** argument struct each recorded call keeps: recorder.c builds its wrappers from
** them, fuse.c reads recorded calls through them.
*/
#ifndef EMBER_COMPILE_ENTRIES_H
#define EMBER_COMPILE_ENTRIES_H
#include "compile.h"

#define CT const em_tensor *
#define MT em_tensor *
#define ARGS_copy(F) F(MT, out) F(CT, src)
#define ARGS_fill(F) F(MT, out) F(double, value)
#define ARGS_unary(F) F(em_unop, op) F(MT, out) F(CT, a)
#define ARGS_binary(F) F(em_binop, op) F(MT, out) F(CT, a) F(CT, b)
#define ARGS_binary_scalar(F) F(em_binop, op) F(MT, out) F(CT, a) F(double, s) F(int, reverse)
#define ARGS_add_scaled(F) F(MT, out) F(CT, a) F(CT, b) F(double, alpha)
#define ARGS_clamp(F) F(MT, out) F(CT, a) F(double, lo) F(double, hi)
#define ARGS_where(F) F(MT, out) F(CT, cond) F(CT, a) F(CT, b)
#define ARGS_reduce(F) F(em_redop, op) F(MT, out) F(CT, a) F(unsigned, mask)
#define ARGS_var(F) F(MT, out) F(CT, a) F(unsigned, mask) F(double, correction) F(int, take_sqrt)
#define ARGS_norm(F) F(MT, out) F(CT, a) F(unsigned, mask) F(double, p)
#define ARGS_arg_reduce(F) F(MT, values) F(MT, indices) F(CT, a) F(int, dim) F(int, want_max) \
  F(int, index_base)
#define ARGS_softmax(F) F(MT, out) F(CT, a) F(int, dim) F(int, log)
#define ARGS_matmul(F) F(MT, out) F(CT, a) F(CT, b)
#define ARGS_index_select(F) F(MT, out) F(CT, a) F(int, dim) F(CT, idx) F(int, index_base)
#define ARGS_gather(F) F(MT, out) F(CT, a) F(int, dim) F(CT, idx) F(int, index_base)
#define ARGS_arange(F) F(MT, out) F(double, start) F(double, step)
#define CG const emi_conv_geom *
#define PG const emi_pool_geom *
#define ARGS_conv2d(F) F(CG, g) F(MT, y) F(CT, x) F(CT, w) F(CT, b)
#define ARGS_conv2d_backward(F) F(CG, g) F(MT, gx) F(MT, gw) F(MT, gb) F(CT, gy) F(CT, x) F(CT, w)
#define ARGS_max_pool2d(F) F(PG, g) F(MT, y) F(MT, ind) F(CT, x) F(int, index_base)
#define ARGS_max_pool2d_backward(F) F(PG, g) F(MT, gx) F(CT, gy) F(CT, ind) F(int, index_base)
#define ARGS_avg_pool2d(F) F(PG, g) F(MT, y) F(CT, x) F(int, cip)
#define ARGS_avg_pool2d_backward(F) F(PG, g) F(MT, gx) F(CT, gy) F(int, cip)
#define ARGS_adaptive_avg_pool2d(F) F(PG, g) F(MT, y) F(CT, x)
#define ARGS_adaptive_avg_pool2d_backward(F) F(PG, g) F(MT, gx) F(CT, gy)
#define ARGS_batch_norm(F) F(MT, y) F(MT, mean) F(MT, invstd) F(MT, rm) F(MT, rv) F(CT, x) \
  F(CT, w) F(CT, b) F(int, training) F(double, momentum) F(double, eps)
#define ARGS_batch_norm_backward(F) F(MT, gx) F(MT, gw) F(MT, gb) F(CT, gy) F(CT, x) \
  F(CT, mean) F(CT, invstd) F(CT, w) F(int, training)
#define ARGS_layer_norm(F) F(MT, y) F(MT, mean) F(MT, rstd) F(CT, x) F(CT, w) F(CT, b) \
  F(double, eps)
#define ARGS_layer_norm_backward(F) F(MT, gx) F(MT, gw) F(MT, gb) F(CT, gy) F(CT, x) \
  F(CT, mean) F(CT, rstd) F(CT, w)
#define ARGS_cross_entropy(F) F(MT, loss) F(MT, lse) F(CT, x) F(CT, target) F(int, index_base) \
  F(int64_t, ignore_index) F(double, smoothing) F(int, reduction)
#define ARGS_cross_entropy_backward(F) F(MT, gx) F(CT, grad_loss) F(CT, x) F(CT, target) \
  F(CT, lse) F(int, index_base) F(int64_t, ignore_index) F(double, smoothing) F(int, reduction)
#define ARGS_nll_loss(F) F(MT, loss) F(CT, logp) F(CT, target) F(int, index_base) \
  F(int64_t, ignore_index) F(int, reduction)
#define ARGS_nll_loss_backward(F) F(MT, gx) F(CT, grad_loss) F(CT, target) F(int, index_base) \
  F(int64_t, ignore_index) F(int, reduction)
#define ARGS_pointwise_loss(F) F(int, kind) F(MT, loss) F(CT, x) F(CT, y) F(int, reduction)
#define ARGS_pointwise_loss_backward(F) F(int, kind) F(MT, gx) F(CT, grad_loss) F(CT, x) \
  F(CT, y) F(int, reduction)
#define ARGS_index_add(F) F(MT, out) F(int, dim) F(CT, idx) F(CT, src) F(int, index_base)
#define ARGS_scatter_add(F) F(MT, out) F(int, dim) F(CT, idx) F(CT, src) F(int, index_base)
#define ARGS_sort(F) F(MT, indices) F(CT, a) F(int, dim) F(int, descending) F(int, index_base) \
  F(int64_t, k)
#define ARGS_scan(F) F(int, op) F(MT, out) F(CT, a) F(int, dim)

#define GENERATED_ENTRIES(X)                                                            \
  X(copy) X(fill) X(unary) X(binary) X(binary_scalar) X(add_scaled) X(clamp) X(where)    \
  X(reduce) X(var) X(norm) X(arg_reduce) X(softmax) X(matmul) X(index_select) X(gather)  \
  X(arange) X(conv2d) X(conv2d_backward) X(max_pool2d) X(max_pool2d_backward)           \
  X(avg_pool2d) X(avg_pool2d_backward) X(adaptive_avg_pool2d)                           \
  X(adaptive_avg_pool2d_backward) X(batch_norm) X(batch_norm_backward) X(layer_norm)    \
  X(layer_norm_backward) X(cross_entropy) X(cross_entropy_backward) X(nll_loss)         \
  X(nll_loss_backward) X(pointwise_loss) X(pointwise_loss_backward) X(index_add)        \
  X(scatter_add)                                                                         \
  X(sort) X(scan)

#define EMI_ARGS_FIELD_(T, n) T n;
#define EMI_ARGS_STRUCT_(name) typedef struct { ARGS_##name(EMI_ARGS_FIELD_) } args_##name;
GENERATED_ENTRIES(EMI_ARGS_STRUCT_)

#endif
