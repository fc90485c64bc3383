/*
** backend.c -- the CPU backend's function table. Each entry lives in the file
** of its op family (copy.c, elementwise.c, reduce.c, matmul.c, index.c, random.c;
** for nn: conv.c, pool.c, normalize.c, nn_loss.c, scatter.c, optim.c).
*/
#include "cpu.h"
#include <stdint.h>

/* A CPU storage is one allocation: the header followed by the data, 64-byte
** aligned. One block instead of two halves the allocator traffic of the small
** temporaries that dominate scripting workloads (a + b on tiny tensors); large
** blocks go through the state's cache (alloc.c). */
enum { DATA_ALIGN = 64 };

static emi_storage *cpu_alloc(emi_device *d, size_t nbytes) {
  size_t total;
  char *block = emi_block_alloc(d->S, sizeof(emi_storage) + DATA_ALIGN + nbytes, &total);
  if (!block) return NULL;
  emi_storage *st = (emi_storage *)block;
  uintptr_t p = (uintptr_t)(block + sizeof(emi_storage));
  p = (p + DATA_ALIGN - 1) & ~(uintptr_t)(DATA_ALIGN - 1);
  st->data = (void *)p;
  st->nbytes = nbytes;
  st->block_size = total;
  return st;
}

static void cpu_free(emi_device *d, emi_storage *st) {
  emi_block_free(d->S, st, st->block_size);
}

const emi_backend emi_cpu_backend = {
  .name = "cpu",
  .id = EMI_BACKEND_CPU,
  .nhwc = EMI_NHWC_CONV | EMI_NHWC_POOL | EMI_NHWC_BN,   /* conv_nhwc.c, pool_nhwc.c, bn_nhwc.c */
  .alloc = cpu_alloc,
  .free = cpu_free,
  .copy = emi_cpu_copy,
  .fill = emi_cpu_fill,
  .unary = emi_cpu_unary,
  .binary = emi_cpu_binary,
  .binary_scalar = emi_cpu_binary_scalar,
  .add_scaled = emi_cpu_add_scaled,
  .clamp = emi_cpu_clamp,
  .where = emi_cpu_where,
  .reduce = emi_cpu_reduce,
  .var = emi_cpu_var,
  .norm = emi_cpu_norm,
  .arg_reduce = emi_cpu_arg_reduce,
  .softmax = emi_cpu_softmax,
  .matmul = emi_cpu_matmul,
  .index_select = emi_cpu_index_select,
  .gather = emi_cpu_gather,
  .uniform = emi_cpu_uniform,
  .normal = emi_cpu_normal,
  .randint = emi_cpu_randint,
  .arange = emi_cpu_arange,
  .conv2d = emi_cpu_conv2d,
  .conv2d_backward = emi_cpu_conv2d_backward,
  .max_pool2d = emi_cpu_max_pool2d,
  .max_pool2d_backward = emi_cpu_max_pool2d_backward,
  .avg_pool2d = emi_cpu_avg_pool2d,
  .avg_pool2d_backward = emi_cpu_avg_pool2d_backward,
  .adaptive_avg_pool2d = emi_cpu_adaptive_avg_pool2d,
  .adaptive_avg_pool2d_backward = emi_cpu_adaptive_avg_pool2d_backward,
  .batch_norm = emi_cpu_batch_norm,
  .batch_norm_backward = emi_cpu_batch_norm_backward,
  .layer_norm = emi_cpu_layer_norm,
  .layer_norm_backward = emi_cpu_layer_norm_backward,
  .cross_entropy = emi_cpu_cross_entropy,
  .cross_entropy_backward = emi_cpu_cross_entropy_backward,
  .nll_loss = emi_cpu_nll_loss,
  .nll_loss_backward = emi_cpu_nll_loss_backward,
  .pointwise_loss = emi_cpu_pointwise_loss,
  .pointwise_loss_backward = emi_cpu_pointwise_loss_backward,
  .index_add = emi_cpu_index_add,
  .scatter_add = emi_cpu_scatter_add,
  .sgd_step_multi = emi_cpu_sgd_step_multi,
  .adam_step_multi = emi_cpu_adam_step_multi,
  .norm_multi = emi_cpu_norm_multi,
  .scale_multi = emi_cpu_scale_multi,
  .sort = emi_cpu_sort,
  .scan = emi_cpu_scan,
};
