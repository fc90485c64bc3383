/*
** ewise.h -- helpers shared by the element-wise op files (elementwise.c,
** copy.c; implemented in promote.c): result-dtype rules, memory-overlap tests
** for in-place ops, and a list of temporaries released on every exit path.
*/
#ifndef EMBER_OPS_EWISE_H
#define EMBER_OPS_EWISE_H
#include "../internal.h"

/* Names of the in-place forms ("add_"), for messages. */
const char *emi_unop_name_(em_unop op);
const char *emi_binop_name_(em_binop op);

/* -- Dtype rules ---------------------------------------------------------------------- */
/* Promotion of two tensors with PyTorch's 0-dim rule: a 0-dim operand beside a
** dimensioned one counts only when it is of a higher kind (bool < int < float). */
em_dtype emi_promote_tensors(const em_tensor *a, const em_tensor *b);
/* Promotion of a tensor (or 0-dim tensor) with a Python number s: integral values
** count as int64, others as float32 (the default dtype). */
em_dtype emi_promote_scalar(em_dtype dt, double s);
/* The dtype a Python number s is taken as (int64 or float32). */
em_dtype emi_scalar_dtype(double s);
/* From the promoted dtype pt of operands of dtypes da, db: the compute dtype ct
** (what both operands are converted to) and the result dtype rt (bool for
** comparisons). Errors (bool subtraction, ...) name op. */
em_status emi_binop_dtypes(em_state *S, const char *op, em_binop b, em_dtype da,
                           em_dtype db, em_dtype pt, em_dtype *ct, em_dtype *rt);
em_status emi_unop_dtypes(em_state *S, const char *op, em_unop u, em_dtype dt,
                          em_dtype *ct, em_dtype *rt);
/* PyTorch's canCast: no float -> integer, no non-bool -> bool. */
int emi_can_cast(em_dtype from, em_dtype to);
/* The "result type X can't be cast to the desired output type Y" error. */
em_status emi_cast_error(em_state *S, const char *op, em_dtype from, em_dtype to);

/* -- Memory overlap ---------------------------------------------------------------------- */
/* a and b may touch the same bytes (same storage and overlapping address ranges). */
int emi_may_overlap(const em_tensor *a, const em_tensor *b);
/* Same storage, offset, dtype size, sizes and strides: element i of one is element
** i of the other, which is safe for element-wise in-place work. */
int emi_same_geometry(const em_tensor *a, const em_tensor *b);
/* Writing t would write some location twice (a stride-0 dim of size > 1). */
int emi_internal_overlap(const em_tensor *t);
/* An input that overlaps the output of an in-place op without being the same
** elements: the error/clone decision of every in-place op. */
static inline int emi_needs_copy(const em_tensor *out, const em_tensor *in) {
  return emi_may_overlap(out, in) && !emi_same_geometry(out, in);
}

/* -- Temporaries -------------------------------------------------------------------------- */
enum { EMI_MAX_TEMPS = 8 };
typedef struct emi_temps { em_tensor *t[EMI_MAX_TEMPS]; int n; } emi_temps;
static inline void emi_temps_init(emi_temps *tp) { tp->n = 0; }
static inline em_tensor *emi_temps_add(emi_temps *tp, em_tensor *t) {
  tp->t[tp->n++] = t;
  return t;
}
static inline void emi_temps_release(emi_temps *tp) {
  while (tp->n > 0) em_tensor_release(tp->t[--tp->n]);
}

/* A new tensor holding t converted to dt, contiguous or, for a channels-last t,
** channels last (added to tp on success). */
em_status emi_convert(em_state *S, const char *op, const em_tensor *t, em_dtype dt,
                      emi_temps *tp, em_tensor **out);
/* t itself when it already has dtype dt, else a converted copy (added to tp). */
em_status emi_as_dtype(em_state *S, const char *op, const em_tensor *t, em_dtype dt,
                       emi_temps *tp, const em_tensor **out);
/* t viewed with shape (added to tp), or t itself when it already has that shape. */
em_status emi_expand_tmp(em_state *S, const char *op, const em_tensor *t,
                         const int64_t *shape, int ndim, emi_temps *tp,
                         const em_tensor **out);
/* Same device, or EM_ERR_DEVICE naming op and both devices. */
em_status emi_check_devices(em_state *S, const char *op, const em_tensor *a,
                            const em_tensor *b);

#endif
