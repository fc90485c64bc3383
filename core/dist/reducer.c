/*
** reducer.c -- gradient averaging for em.distribute's wrap: buckets of gradients
** allreduced during backward.
**
** The plan, made once at wrap time. Parameters are taken in reverse order of
** registration (backward produces the last layer's gradients first) and packed
** into buckets: the first one small (about first_bucket_bytes, so communication
** starts early), the others about bucket_bytes, one dtype per bucket. Each bucket
** is one contiguous tensor, and each parameter has a view into it of its own
** shape: its "home".
**
** During backward. Each home is its parameter's gradient destination (engine.c):
** a parameter without .grad takes its first gradient there, and the common
** producers (a Linear's or matmul's weight gradient, a broadcast bias's sum,
** conv2d's weight and bias gradients) write it there in the first place, so the
** gradient is never copied. A gradient hook on every parameter (the engine calls
** it once the parameter's gradient is final for this backward) makes sure it is
** in its home -- one copy, only when .grad is some other tensor (one the user
** assigned) -- and that the home is the parameter's .grad. So gradients are views
** into bucket memory, and no second gradient-sized buffer is kept; a .grad kept
** from an earlier step is that view, and the next backward writes into it. When a
** bucket's last gradient arrives its allreduce (mean) is started on the
** communicator's thread, which runs it while the engine goes on computing the
** gradients of earlier layers. Buckets are started strictly in bucket order,
** even when a later one fills first: every replica must issue the same
** collectives in the same order, and gradient timing differs between replicas.
**
** At the end of backward (an engine callback) the buckets that are still
** missing gradients are dealt with -- parameters that got none are an error
** naming them, or with find_unused zeros that still take part in the average --
** then every bucket is waited for, so that backward returns with the same
** averaged .grad on every replica. The hooks act only in a backward that follows
** em_reducer_prepare (the wrapped model's forward), which is what no_sync and
** unrelated backward calls rely on.
**
** GPU replicas (a communicator on a device): the buckets are device memory, the
** copies into them are kernels on the compute stream, and each allreduce is
** ordered after them by an event (comm.c): the hook only queues work, and the
** host never waits for the device until the optimizer reads a value.
**
** One replica: nothing to average, so no copies and no collectives; the hooks
** only note which parameters got gradients (the unused check still holds).
*/
#include "comm.h"
#include "../autograd/autograd.h"
#include "../profile/profile.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct bucket {
  em_tensor *buf;            /* 1-D, contiguous */
  int first, count;          /* its parameters: order[first .. first+count) */
  int pending;               /* parameters whose gradient is not yet in */
  em_comm_work *work;        /* the allreduce under way, or NULL */
} bucket;

typedef struct hook_slot {
  struct em_reducer *r;
  int index;                 /* parameter index */
} hook_slot;

struct em_reducer {
  em_state *S;
  em_comm *c;
  int nparams, nbuckets;
  size_t cap;                /* entries of each per-parameter array (>= 1) */
  em_tensor **params;        /* retained */
  char **names;
  em_tensor **home;          /* [nparams] views into the buckets (NULL with one replica) */
  int *bucket_of;            /* [nparams] */
  int *order;                /* parameter indices in bucket order */
  unsigned char *ready;      /* [nparams] gradient in, this backward */
  hook_slot *slots;
  bucket *b;
  int armed, next_launch, find_unused, single;
  em_reducer_stats stats;
};

/* -- Building the plan ---------------------------------------------------------------- */

static em_status plan(em_reducer *r, double bucket_bytes, double first_bytes) {
  em_state *S = r->S;
  int np = r->nparams;
  r->b = emi_malloc(S, sizeof *r->b * r->cap);
  if (!r->b) return emi_error(S, EM_ERR_NOMEM, "wrap: out of memory");
  memset(r->b, 0, sizeof *r->b * r->cap);
  int nb = 0, k = 0;
  double cap = first_bytes, filled = 0;
  for (int i = np - 1; i >= 0; i--) {
    em_tensor *p = r->params[i];
    size_t bytes = (size_t)p->numel * em_dtype_size(p->dtype);
    bucket *cur = nb ? &r->b[nb - 1] : NULL;
    /* a bucket takes parameters until it holds cap bytes (the last one may take
    ** it past cap: a big weight joins the small ones before it rather than
    ** waiting alone for the next bucket) */
    int fits = cur && r->params[r->order[cur->first]]->dtype == p->dtype && filled < cap;
    if (!fits) {
      if (cur) cap = bucket_bytes;
      cur = &r->b[nb++];
      cur->first = k;
      filled = 0;
    }
    r->order[k++] = i;
    r->bucket_of[i] = nb - 1;
    cur->count++;
    filled += (double)bytes;
  }
  r->nbuckets = nb;
  if (r->single) return EM_OK;
  /* one buffer per bucket, and each parameter's home in it */
  for (int j = 0; j < nb; j++) {
    bucket *bk = &r->b[j];
    int64_t total = 0;
    for (int q = 0; q < bk->count; q++) total += r->params[r->order[bk->first + q]]->numel;
    em_dtype dt = r->params[r->order[bk->first]]->dtype;
    /* on the parameters' device: a GPU replica's buckets are device memory that
    ** the gradients' kernels fill and NCCL reduces (comm.c orders the two) */
    em_status st = em_full(S, &total, 1, 0.0, dt, r->params[r->order[bk->first]]->device,
                           &bk->buf);
    if (st) return st;
    int64_t off = 0;
    for (int q = 0; q < bk->count; q++) {
      int i = r->order[bk->first + q];
      em_tensor *p = r->params[i];
      int64_t strides[EM_MAX_DIMS];
      emi_contiguous_strides(p->sizes, p->ndim, strides);
      if ((st = emi_tensor_view(S, bk->buf, p->sizes, strides, p->ndim, off, &r->home[i])) ||
          (st = emi_ag_set_grad_dest(S, p, r->home[i])))
        return st;
      off += p->numel;
    }
  }
  return EM_OK;
}

/* -- During backward --------------------------------------------------------------------- */

static em_status launch_ready(em_reducer *r) {
  while (r->next_launch < r->nbuckets && r->b[r->next_launch].pending == 0) {
    bucket *bk = &r->b[r->next_launch++];
    double t0 = r->S->profiler ? emi_now() : 0;
    em_status st = em_comm_allreduce(r->S, r->c, bk->buf, EM_COMM_MEAN, &bk->work);
    if (st) return st;
    if (r->S->profiler) {        /* the flow arrow's tail: this bucket's launch */
      em_profile_event ev;
      memset(&ev, 0, sizeof ev);
      ev.t0 = t0;
      ev.t1 = emi_now();
      ev.name = "bucket ready";
      ev.kind = EM_PROF_BUCKET_READY;
      ev.device = EM_CPU;
      ev.bytes = bk->buf->numel * (int64_t)em_dtype_size(bk->buf->dtype);
      ev.flow = (int64_t)bk->work->seq;
      ev.arg0 = r->next_launch - 1;
      emi_profile_record(r->S->profiler, &ev);
    }
  }
  return EM_OK;
}

/* Puts parameter i's gradient into its home (or zeros there when it has none). */
static em_status move_home(em_reducer *r, int i) {
  em_state *S = r->S;
  em_tensor *p = r->params[i], *h = r->home[i];
  em_tensor *g = emi_ag_grad(p);
  if (g == h) return EM_OK;
  em_status st = g ? em_copy_(S, h, g) : em_fill_(S, h, 0);
  if (st) return st;
  return em_tensor_set_grad(S, p, h);
}

static em_status mark_ready(em_reducer *r, int i) {
  if (r->ready[i]) return EM_OK;
  r->ready[i] = 1;
  if (r->single) return EM_OK;
  em_status st = move_home(r, i);
  if (st) return st;
  r->b[r->bucket_of[i]].pending--;
  return launch_ready(r);
}

static em_status grad_hook(em_state *S, em_tensor *t, void *ud) {
  hook_slot *s = ud;
  em_reducer *r = s->r;
  (void)S; (void)t;
  if (!r->armed) return EM_OK;
  return mark_ready(r, s->index);
}

/* Waits for every launched bucket; the first error is returned. */
static em_status wait_all(em_reducer *r, double t_compute_end) {
  em_status first = EM_OK;
  char msg[EMI_ERRMSG_SIZE];
  double t0 = emi_now();
  for (int j = 0; j < r->nbuckets; j++) {
    bucket *bk = &r->b[j];
    if (!bk->work) continue;
    em_status st = em_comm_work_wait(r->S, bk->work);
    if (st && !first) { first = st; memcpy(msg, r->S->errmsg, sizeof msg); }
    em_comm_work *w = bk->work;
    if (!st) {   /* from the time every replica was there: the transfer itself */
      r->stats.comm_s += w->t_end - w->t_ready;
      double hidden = (t_compute_end < w->t_end ? t_compute_end : w->t_end) - w->t_ready;
      if (hidden > 0) r->stats.overlap_s += hidden;
    }
    em_comm_work_free(w);
    bk->work = NULL;
  }
  r->stats.wait_s += emi_now() - t0;
  if (first) memcpy(r->S->errmsg, msg, sizeof msg);
  return first;
}

static em_status backward_end(em_state *S, int failed, void *ud) {
  em_reducer *r = ud;
  if (!r->armed) return EM_OK;
  r->armed = 0;
  double t_end = emi_now();
  if (failed) { wait_all(r, t_end); return EM_OK; }   /* the engine reports its own error */
  em_status st = EM_OK;
  /* parameters that got no gradient in this backward */
  int missing = 0;
  for (int i = 0; i < r->nparams; i++) missing += !r->ready[i];
  if (missing && !r->find_unused) {
    char msg[EMI_ERRMSG_SIZE];
    int n = snprintf(msg, sizeof msg, "wrap: %d parameter%s received no gradient in this "
                     "backward: ", missing, missing > 1 ? "s" : "");
    int shown = 0;
    for (int i = 0; i < r->nparams && n < (int)sizeof msg - 80; i++) {
      if (r->ready[i]) continue;
      n += snprintf(msg + n, sizeof msg - (size_t)n, "%s%s", shown++ ? ", " : "", r->names[i]);
    }
    if (shown < missing) n += snprintf(msg + n, sizeof msg - (size_t)n, ", ...");
    snprintf(msg + n, sizeof msg - (size_t)n, " (every replica must average every gradient; "
             "pass find_unused = true to wrap when some parameters are not used in a step)");
    wait_all(r, t_end);
    return emi_error(S, EM_ERR_ARG, "%s", msg);
  }
  for (int i = 0; i < r->nparams && !st; i++)
    if (!r->ready[i]) st = mark_ready(r, i);   /* zeros that take part in the average */
  em_status wst = wait_all(r, t_end);
  if (!st && !r->single) r->stats.steps++;
  return st ? st : wst;
}

/* -- Public ----------------------------------------------------------------------------------- */

em_status em_reducer_prepare(em_state *S, em_reducer *r) {
  if (!r) return emi_error(S, EM_ERR_ARG, "reducer: NULL");
  r->armed = 1;
  r->next_launch = 0;
  memset(r->ready, 0, (size_t)r->nparams);
  for (int j = 0; j < r->nbuckets; j++) r->b[j].pending = r->b[j].count;
  return EM_OK;
}

int em_reducer_num_buckets(const em_reducer *r) { return r ? r->nbuckets : 0; }
int em_reducer_bucket_size(const em_reducer *r, int b) {
  return r && b >= 0 && b < r->nbuckets ? r->b[b].count : 0;
}
void em_reducer_stats_get(const em_reducer *r, em_reducer_stats *out) {
  if (!r || !out) return;
  *out = r->stats;
  out->buckets = r->nbuckets;
}

void em_reducer_free(em_reducer *r) {
  if (!r) return;
  em_state *S = r->S;
  for (int j = 0; j < r->nbuckets; j++) {
    if (r->b[j].work) em_comm_work_free(r->b[j].work);
    em_tensor_release(r->b[j].buf);
  }
  em_backward_remove_callback(S, backward_end, r);
  for (int i = 0; i < r->nparams; i++) {
    if (r->params[i]) {
      em_tensor_remove_grad_hook(r->params[i], grad_hook, &r->slots[i]);
      if (r->home[i] && r->params[i]->ag && r->params[i]->ag->grad_dest == r->home[i])
        emi_ag_set_grad_dest(S, r->params[i], NULL);
      em_tensor_release(r->params[i]);
    }
    em_tensor_release(r->home[i]);
    if (r->names[i]) emi_free(S, r->names[i], strlen(r->names[i]) + 1);
  }
  size_t n = r->cap;
  emi_free(S, r->b, sizeof *r->b * n);
  emi_free(S, r->params, sizeof *r->params * n);
  emi_free(S, r->names, sizeof *r->names * n);
  emi_free(S, r->home, sizeof *r->home * n);
  emi_free(S, r->bucket_of, sizeof *r->bucket_of * n);
  emi_free(S, r->order, sizeof *r->order * n);
  emi_free(S, r->ready, n);
  emi_free(S, r->slots, sizeof *r->slots * n);
  emi_free(S, r, sizeof *r);
}

em_status em_reducer_new(em_state *S, em_comm *c, em_tensor *const *params,
                         const char *const *names, int nparams, double bucket_bytes,
                         double first_bucket_bytes, int find_unused, em_reducer **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "wrap: NULL output");
  *out = NULL;
  if (!c) return emi_error(S, EM_ERR_ARG, "wrap: NULL communicator");
  if (nparams < 0 || (nparams > 0 && !params))
    return emi_error(S, EM_ERR_ARG, "wrap: bad parameter list");
  if (!(bucket_bytes > 0)) bucket_bytes = 25.0 * (1 << 20);
  if (!(first_bucket_bytes > 0) || first_bucket_bytes > bucket_bytes)
    first_bucket_bytes = bucket_bytes;
  for (int i = 0; i < nparams; i++) {
    em_tensor *p = params[i];
    const char *nm = names && names[i] ? names[i] : "?";
    if (!p) return emi_error(S, EM_ERR_ARG, "wrap: parameter %d (%s) is NULL", i, nm);
    /* one replica moves nothing: its parameters may live anywhere */
    int want = c->dev ? emi_commdev_device(c->dev) : EM_CPU;
    if (p->device != want && em_comm_size(c) > 1) {
      char b[16], b2[16];
      return emi_error(S, EM_ERR_DEVICE, "wrap: parameter %s is on %s, but the %s "
                       "communicator averages gradients on %s", nm,
                       emi_device_name(b, p->device), em_comm_backend(c),
                       emi_device_name(b2, want));
    }
    if (!em_dtype_is_floating(p->dtype) || !p->requires_grad || emi_ag_grad_fn(p))
      return emi_error(S, EM_ERR_ARG, "wrap: parameter %s must be a floating-point leaf "
                       "that requires grad (got %s%s)", nm, em_dtype_name(p->dtype),
                       emi_ag_grad_fn(p) ? ", not a leaf" : !p->requires_grad ? ", no grad" : "");
  }
  em_reducer *r = emi_malloc(S, sizeof *r);
  if (!r) return emi_error(S, EM_ERR_NOMEM, "wrap: out of memory");
  memset(r, 0, sizeof *r);
  r->S = S;
  r->c = c;
  r->nparams = nparams;
  r->find_unused = find_unused != 0;
  r->single = em_comm_size(c) == 1;
  size_t n = (size_t)(nparams > 0 ? nparams : 1);
  r->params = emi_malloc(S, sizeof *r->params * n);
  r->names = emi_malloc(S, sizeof *r->names * n);
  r->home = emi_malloc(S, sizeof *r->home * n);
  r->bucket_of = emi_malloc(S, sizeof *r->bucket_of * n);
  r->order = emi_malloc(S, sizeof *r->order * n);
  r->ready = emi_malloc(S, n);
  r->slots = emi_malloc(S, sizeof *r->slots * n);
  em_status st = EM_OK;
  r->cap = n;
  if (!r->params || !r->names || !r->home || !r->bucket_of || !r->order || !r->ready ||
      !r->slots) {
    r->nparams = 0;            /* em_reducer_free then touches no entry, frees what came */
    em_reducer_free(r);
    return emi_error(S, EM_ERR_NOMEM, "wrap: out of memory");
  }
  memset(r->params, 0, sizeof *r->params * n);
  memset(r->names, 0, sizeof *r->names * n);
  memset(r->home, 0, sizeof *r->home * n);
  memset(r->ready, 0, n);
  for (int i = 0; i < nparams; i++) {
    em_tensor_retain(params[i]);
    r->params[i] = params[i];
    const char *nm = names && names[i] ? names[i] : "?";
    size_t len = strlen(nm) + 1;
    if (!(r->names[i] = emi_malloc(S, len))) { st = emi_error(S, EM_ERR_NOMEM, "wrap: out of memory"); break; }
    memcpy(r->names[i], nm, len);
  }
  if (!st) st = plan(r, bucket_bytes, first_bucket_bytes);
  for (int i = 0; i < nparams && !st; i++) {
    r->slots[i].r = r;
    r->slots[i].index = i;
    st = em_tensor_add_grad_hook(S, r->params[i], grad_hook, &r->slots[i]);
  }
  if (!st) st = em_backward_add_callback(S, backward_end, r);
  if (st) {
    char msg[EMI_ERRMSG_SIZE];
    memcpy(msg, S->errmsg, sizeof msg);
    em_reducer_free(r);
    memcpy(S->errmsg, msg, sizeof msg);
    return st;
  }
  *out = r;
  return EM_OK;
}
