/*
** backend.c -- the CPU backend's function table. Each entry lives in the file
** of its op family (copy.c, elementwise.c, reduce.c, matmul.c, index.c, random.c).
*/
#include "cpu.h"

static void *cpu_alloc(em_state *S, int device, size_t n) { (void)device; return emi_malloc(S, n); }
static void cpu_free(em_state *S, int device, void *p, size_t n) { (void)device; emi_free(S, p, n); }

const emi_backend emi_cpu_backend = {
  .name = "cpu",
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
};
