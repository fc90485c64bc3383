/*
** k_optim.c -- the launchers of the multi-tensor optimizer kernels
** (k_optim.cu): each entry checks the tensors, writes the chunk table (one
** mt_tensor per tensor, with the constants the CPU kernels compute in double),
** copies it to the device on the compute stream ahead of the kernel, and
** releases it after the launch.
*/
#include "k_optim.h"
#include "k_optim_args.h"
#include <math.h>

/* The constants in double as core/cpu/optim.c computes them: no FMA either. */
#pragma GCC optimize("fp-contract=off")

/* The table of n tensors (t0 and the parallel lists t1..t3, c0, c1, each may be
** NULL) on d's device: built in a CPU tensor, copied by the backend's copy (which
** snapshots it and orders the copy on the compute stream). extra: bytes after the
** table, zeroed (the norm's counter). *chunks: the launch's chunk count. */
static em_status mt_table(emi_device *d, const char *op, int n, em_tensor *const *t0,
                          const em_tensor *const *t1, em_tensor *const *t2,
                          em_tensor *const *t3, const double *c0, const double *c1,
                          const int *first, size_t extra, em_tensor **dev,
                          int64_t *chunks) {
  em_state *S = d->S;
  int64_t bytes = (int64_t)(sizeof(mt_tensor) * (size_t)n + extra);
  em_tensor *h = NULL;
  em_status st = emi_tensor_new(S, op, &bytes, 1, EM_UINT8, EM_CPU, &h);
  if (st) return st;
  mt_tensor *tab = (mt_tensor *)em_tensor_data(h);
  memset(tab, 0, (size_t)bytes);
  int64_t nc = 0;
  for (int i = 0; i < n; i++) {
    mt_tensor *e = &tab[i];
    e->p = (char *)em_tensor_data(t0[i]);
    e->g = t1 ? (const char *)em_tensor_data(t1[i]) : NULL;
    e->s1 = t2 ? (char *)em_tensor_data(t2[i]) : NULL;
    e->s2 = t3 ? (char *)em_tensor_data(t3[i]) : NULL;
    e->n = t0[i]->numel;
    e->chunk0 = nc;
    e->c0 = first ? (double)(first[i] != 0) : c0 ? c0[i] : 0;
    e->c1 = c1 ? c1[i] : 0;
    nc += (e->n + CHUNK - 1) / CHUNK;
  }
  *chunks = nc;
  if (!(st = emi_tensor_new(S, op, &bytes, 1, EM_UINT8, d->index, dev)) &&
      (st = d->backend->copy(d, *dev, h))) {
    em_tensor_release(*dev);
    *dev = NULL;
  }
  em_tensor_release(h);
  return st;
}

static em_status mt_launch(emi_device *d, const char *op, const emk_kernel *k, mt_args *a) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  int64_t blocks = a->nchunks < MAX_BLOCKS ? a->nchunks : MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {LANES, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

/* Table, launch, release: the update kernel over n tensors. */
static em_status mt_update(emi_device *d, const char *op, mt_args *a, int n,
                           em_tensor *const *t0, const em_tensor *const *t1,
                           em_tensor *const *t2, em_tensor *const *t3, const double *c0,
                           const double *c1, const int *first) {
  em_tensor *tab = NULL;
  em_status st = mt_table(d, op, n, t0, t1, t2, t3, c0, c1, first, 0, &tab, &a->nchunks);
  if (st) return st;
  a->tab = (const mt_tensor *)em_tensor_data(tab);
  a->ntens = n;
  a->f64 = t0[0]->dtype == EM_FLOAT64;
  st = mt_launch(d, op, &k_mt_update, a);
  em_tensor_release(tab);   /* reused only by work queued after the kernel */
  return st;
}

em_status emk_sgd_step_multi(emi_device *d, int n, em_tensor *const *p,
                             const em_tensor *const *g, em_tensor *const *buf,
                             const int *first, double lr, double momentum, double dampening,
                             double wd, int nesterov) {
  mt_args a;
  memset(&a, 0, sizeof a);
  a.kind = MT_SGD;
  a.h[0] = lr;
  a.h[1] = momentum;
  a.h[2] = 1.0 - dampening;     /* as the CPU kernel rounds it: in double, then to T */
  a.h[3] = wd;
  a.h[4] = nesterov != 0;
  a.h[5] = buf != NULL;
  return mt_update(d, "sgd_step_multi", &a, n, p, g, buf, NULL, NULL, NULL, first);
}

em_status emk_adam_step_multi(emi_device *d, int n, em_tensor *const *p,
                              const em_tensor *const *g, em_tensor *const *m,
                              em_tensor *const *v, const double *step_size,
                              const double *bc2_sqrt, double beta1, double beta2, double eps,
                              double wd, double decay) {
  mt_args a;
  memset(&a, 0, sizeof a);
  a.kind = MT_ADAM;
  a.h[0] = beta1;
  a.h[1] = beta2;
  a.h[2] = 1.0 - beta1;
  a.h[3] = 1.0 - beta2;
  a.h[4] = eps;
  a.h[5] = wd;
  a.p = decay;
  return mt_update(d, "adam_step_multi", &a, n, p, g, m, v, step_size, bc2_sqrt, NULL);
}

em_status emk_scale_multi(emi_device *d, int n, em_tensor *const *t, double scale) {
  mt_args a;
  memset(&a, 0, sizeof a);
  a.kind = MT_SCALE;
  a.h[0] = scale;
  return mt_update(d, "scale_multi", &a, n, t, NULL, NULL, NULL, NULL, NULL, NULL);
}

em_status emk_norm_multi(emi_device *d, em_tensor *out, int n, const em_tensor *const *t,
                         double p) {
  const char *op = "norm_multi";
  em_state *S = d->S;
  mt_args a;
  memset(&a, 0, sizeof a);
  a.norm = isinf(p) ? N_MAXABS : p == 2 ? N_SUMSQ : p == 1 ? N_SUMABS : N_SUMPOW;
  a.p = p;
  /* the table is read-only here; mt_table takes the tensors as its t0 list */
  em_tensor *tab = NULL, *part = NULL;
  size_t counter = sizeof(double);       /* the done counter, zeroed, after the table */
  em_status st = mt_table(d, op, n, (em_tensor *const *)t, NULL, NULL, NULL, NULL, NULL,
                          NULL, counter, &tab, &a.nchunks);
  if (st) return st;
  if ((st = emi_tensor_new(S, op, &a.nchunks, 1, EM_FLOAT64, d->index, &part))) {
    em_tensor_release(tab);
    return st;
  }
  a.tab = (const mt_tensor *)em_tensor_data(tab);
  a.done = (unsigned *)((char *)em_tensor_data(tab) + sizeof(mt_tensor) * (size_t)n);
  a.partial = (double *)em_tensor_data(part);
  a.out = (double *)em_tensor_data(out);
  a.ntens = n;
  a.f64 = t[0]->dtype == EM_FLOAT64;
  st = mt_launch(d, op, &k_mt_norm, &a);
  em_tensor_release(part);
  em_tensor_release(tab);
  return st;
}
