/*
** function.c -- custom autograd functions (em_function_apply): a node whose
** backward is the host's function, for operations autograd can't see into
** (activation checkpointing recomputes a forward there; a host may wrap a
** kernel of its own). The output is a view of the value the host computed; the
** node's edges go to the inputs that require grad, leaves or not. The host's
** data lives as long as the node: release(ud) runs when the node is freed.
*/
#include "autograd.h"

typedef struct fn_ext {
  em_state *S;
  em_function_backward_fn fn;
  void *ud;
  void (*release)(void *ud);
  size_t size;
  char name[];
} fn_ext;

static void ext_free(void *p) {
  fn_ext *x = p;
  if (x->release) x->release(x->ud);
  emi_free(x->S, x, x->size);
}

/* Whether g's shape sums to the edge's (what the engine's fit does). */
static int fits(const em_tensor *g, const emi_ag_edge *e) {
  int lead = g->ndim - e->ndim;
  if (lead < 0) return 0;
  for (int d = 0; d < e->ndim; d++)
    if (g->sizes[lead + d] != e->sizes[d] && e->sizes[d] != 1) return 0;
  return 1;
}

static em_status function_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                   em_tensor **gin) {
  fn_ext *x = n->ext;
  S->ag_foreign++;                 /* the host's code: engine.c, "Memory inside a backward" */
  em_status st = x->fn(S, x->ud, g, gin);
  S->ag_foreign--;
  if (st) return st;
  for (int i = 0; i < n->ninputs; i++) {
    em_tensor *gi = gin[i];
    if (!gi || !emi_ag_needs(n, i)) continue;
    char b[EMI_SHAPE_STR];
    if (!fits(gi, &n->in[i]))
      return emi_error(S, EM_ERR_SHAPE, "%s: backward returned a gradient of shape %s for "
                       "input %lld, of shape %s", n->name, emi_tshape(S, gi), emi_ix(S, i),
                       emi_shape_str(b, n->in[i].sizes, n->in[i].ndim));
    if (!em_dtype_is_floating(gi->dtype))
      return emi_error(S, EM_ERR_DTYPE, "%s: backward returned a gradient of dtype %s for "
                       "input %lld (gradients are floating point)", n->name,
                       em_dtype_name(gi->dtype), emi_ix(S, i));
  }
  return EM_OK;
}

em_status em_function_apply(em_state *S, const char *name, const em_tensor *value,
                            em_tensor *const *inputs, int n, em_function_backward_fn fn,
                            void *ud, void (*release)(void *ud), em_tensor **out) {
  if (!name) name = "function";
  em_status st = emi_check_tensor(S, name, value);
  if (st) return st;
  if (!fn) return emi_error(S, EM_ERR_ARG, "%s: NULL backward function", name);
  if (n < 0 || (n > 0 && !inputs))
    return emi_error(S, EM_ERR_ARG, "%s: bad list of %d inputs", name, n);
  for (int i = 0; i < n; i++)
    if ((st = emi_check_tensor(S, name, inputs[i]))) return st;
  const em_tensor *const *in = (const em_tensor *const *)inputs;
  int record = emi_ag_wanted_list(S, in, n);
  if (record && !em_dtype_is_floating(value->dtype))
    return emi_error(S, EM_ERR_DTYPE, "%s: the value is %s; only floating point outputs can "
                     "require grad", name, em_dtype_name(value->dtype));
  em_tensor *o;
  if ((st = em_detach(S, value, &o))) return st;
  if (!record) {   /* no node: the host's data is done with at once */
    if (release) release(ud);
    *out = o;
    return EM_OK;
  }
  size_t len = strlen(name), size = sizeof(fn_ext) + len + 1;
  fn_ext *x = emi_malloc(S, size);
  if (!x) {
    em_tensor_release(o);
    return emi_error(S, EM_ERR_NOMEM, "%s: out of memory recording for autograd", name);
  }
  *x = (fn_ext){.S = S, .fn = fn, .ud = ud, .release = NULL, .size = size};
  memcpy(x->name, name, len + 1);
  emi_ag_node *node;
  if ((st = emi_ag_node_new(S, x->name, function_backward, o, in, n, &node))) {
    emi_free(S, x, size);
    em_tensor_release(o);
    return st;
  }
  x->release = release;   /* from here on the node owns ud */
  node->ext = x;
  node->ext_free = ext_free;
  *out = o;
  return EM_OK;
}

em_status em_set_error(em_state *S, em_status code, const char *msg) {
  if (!S) return code;
  if (code == EM_OK || msg == S->errmsg) return code;   /* already the message */
  return emi_error(S, code, "%s", msg ? msg : "error");
}

void em_function_release_flag(void *ud) {
  if (ud) __atomic_store_n((int32_t *)ud, 0, __ATOMIC_RELEASE);
}
