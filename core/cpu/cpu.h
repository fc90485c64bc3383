/*
** cpu.h -- the CPU backend's kernels, one declaration per backend table entry
** (see emi_backend in internal.h for what each one may assume).
*/
#ifndef EMBER_CPU_H
#define EMBER_CPU_H
#include "../internal.h"

/* copy.c */
em_status emi_cpu_copy(emi_device *dev, em_tensor *out, const em_tensor *src);
em_status emi_cpu_fill(emi_device *dev, em_tensor *out, double value);
/* elementwise.c */
em_status emi_cpu_unary(emi_device *dev, em_unop op, em_tensor *out, const em_tensor *a);
em_status emi_cpu_binary(emi_device *dev, em_binop op, em_tensor *out, const em_tensor *a,
                         const em_tensor *b);
em_status emi_cpu_binary_scalar(emi_device *dev, em_binop op, em_tensor *out,
                                const em_tensor *a, double s, int reverse);
em_status emi_cpu_add_scaled(emi_device *dev, em_tensor *out, const em_tensor *a,
                             const em_tensor *b, double alpha);
em_status emi_cpu_clamp(emi_device *dev, em_tensor *out, const em_tensor *a, double lo,
                        double hi);
em_status emi_cpu_where(emi_device *dev, em_tensor *out, const em_tensor *cond,
                        const em_tensor *a, const em_tensor *b);
/* reduce.c */
em_status emi_cpu_reduce(emi_device *dev, em_redop op, em_tensor *out, const em_tensor *a,
                         unsigned mask);
em_status emi_cpu_var(emi_device *dev, em_tensor *out, const em_tensor *a, unsigned mask,
                      double correction, int take_sqrt);
em_status emi_cpu_norm(emi_device *dev, em_tensor *out, const em_tensor *a, unsigned mask,
                       double p);
em_status emi_cpu_arg_reduce(emi_device *dev, em_tensor *values, em_tensor *indices,
                             const em_tensor *a, int dim, int want_max, int index_base);
em_status emi_cpu_softmax(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                          int log);
/* matmul.c */
em_status emi_cpu_matmul(emi_device *dev, em_tensor *out, const em_tensor *a,
                         const em_tensor *b);
/* index.c */
em_status emi_cpu_index_select(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                               const em_tensor *idx, int index_base);
em_status emi_cpu_gather(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                         const em_tensor *idx, int index_base);
/* random.c */
em_status emi_cpu_uniform(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                          double lo, double hi);
em_status emi_cpu_normal(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                         double mean, double std);
em_status emi_cpu_randint(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                          int64_t lo, int64_t hi);
em_status emi_cpu_arange(emi_device *dev, em_tensor *out, double start, double step);

#endif
