/*
** tensor.c -- tensor handles and storages: creation, refcounting, accessors,
** broadcasting helpers and the strided iterator the kernels walk with.
**
** Storages come from the backend of their device (emi_backend.alloc), which
** decides the layout: the CPU's is one block, header then data (cpu/backend.c).
*/
#include "internal.h"
#include <stdint.h>

enum { STORAGE_ALIGN = 64 };

/* -- Storage ------------------------------------------------------------------- */

/* Storages may be made on loader worker threads, so the counters are atomic. */
static void count_up(int64_t *allocated, int64_t *peakp, int64_t nbytes) {
  int64_t now = __atomic_add_fetch(allocated, nbytes, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(peakp, __ATOMIC_RELAXED);
  while (now > peak &&
         !__atomic_compare_exchange_n(peakp, &peak, now, 1, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {}
}

/* The state's total, and the CPU's or the meta device's own (accelerators keep
** theirs in their allocators). */
static emi_mem_count *device_count(em_state *S, int device) {
  return device == EM_CPU ? &S->cpu_mem : device == EM_META ? &S->meta_mem : NULL;
}

/* reserved: the device's count already holds nbytes (cpu_reserve); only its
** peak is brought up to date. */
static void account(em_state *S, int device, size_t nbytes, bool reserved) {
  count_up(&S->mem_allocated, &S->mem_peak, (int64_t)nbytes);
  emi_mem_count *c = device_count(S, device);
  if (c) count_up(&c->allocated, &c->peak, reserved ? 0 : (int64_t)nbytes);
}

/* The CPU's cap (em_set_memory_limit). The bytes are added to the count before
** the block is allocated, so that threads allocating at once (loader workers)
** can't pass the cap together; a refusal takes them off again. Returns whether
** nbytes were reserved (false also when there is no cap). */
static bool cpu_reserve(em_state *S, size_t nbytes, bool *over) {
  int64_t limit = __atomic_load_n(&S->cpu_limit, __ATOMIC_RELAXED);
  if (limit <= 0) return false;
  int64_t now = __atomic_add_fetch(&S->cpu_mem.allocated, (int64_t)nbytes, __ATOMIC_RELAXED);
  if (now > limit) {
    __atomic_sub_fetch(&S->cpu_mem.allocated, (int64_t)nbytes, __ATOMIC_RELAXED);
    *over = true;
  }
  return !*over;
}

/* The dispatch counters of alloc and free (backend.h). These two are counted
** with an atomic add, unlike the ops': loader workers make and drop storages on
** threads of their own. */
static inline void count_entry(em_state *S, const emi_device *d, int entry) {
  __atomic_add_fetch(&S->dispatch_counts[d->backend->id][entry], 1, __ATOMIC_RELAXED);
}

/* Counts nbytes in (delta > 0) or out of the state's and the device's totals,
** outside a storage's own make and release (core/resident.c). */
void emi_storage_account(em_state *S, int device, int64_t delta) {
  if (delta > 0) { account(S, device, (size_t)delta, false); return; }
  __atomic_add_fetch(&S->mem_allocated, delta, __ATOMIC_RELAXED);
  emi_mem_count *c = device_count(S, device);
  if (c) __atomic_add_fetch(&c->allocated, delta, __ATOMIC_RELAXED);
}

/* NULL when the device refused; *over says when the CPU's cap was the reason. */
static emi_storage *storage_try(emi_device *d, size_t nbytes, bool *over) {
  em_state *S = d->S;
  bool reserved = d->index == EM_CPU && cpu_reserve(S, nbytes, over);
  if (*over) return NULL;
  count_entry(S, d, EMI_ENTRY_alloc);
  emi_storage *st = d->backend->alloc(d, nbytes);
  if (!st) {
    if (reserved) __atomic_sub_fetch(&S->cpu_mem.allocated, (int64_t)nbytes, __ATOMIC_RELAXED);
    return NULL;
  }
  st->refcount = 1;
  st->device = d->index;
  st->S = S;
  st->version = 0;
  st->ext_free = NULL;
  st->ext_ud = NULL;
  account(S, d->index, nbytes, reserved);
  return st;
}

/* storage_try, and once more after the host's reclaim inside a backward
** (engine.c, "Memory inside a backward"). */
static emi_storage *storage_new(emi_device *d, size_t nbytes, bool *over) {
  emi_storage *st = storage_try(d, nbytes, over);
  if (!st && d->index != EM_META && emi_backward_reclaim(d->S)) {
    *over = false;
    st = storage_try(d, nbytes, over);
  }
  return st;
}

emi_storage *emi_storage_new(emi_device *d, size_t nbytes) {
  bool over = false;
  emi_storage *st = storage_new(d, nbytes, &over);
  if (!st && over) emi_cpu_limit_why(d->S, nbytes);
  return st;
}

/* A count of 1 read by its only holder can't change under us (another thread
** would need a reference to raise it), so the common last release skips the
** atomic read-modify-write. */
static inline bool last_reference(int *refcount) {
  return __atomic_load_n(refcount, __ATOMIC_ACQUIRE) == 1 || emi_atomic_dec(refcount) == 0;
}

void emi_storage_release(emi_storage *st) {
  if (!last_reference(&st->refcount)) return;
  em_state *S = st->S;
  if (emi_storage_is_slice(st)) {   /* a compiled step's arena counts its bytes */
    emi_free(S, st, sizeof *st);
    return;
  }
  __atomic_sub_fetch(&S->mem_allocated, (int64_t)st->nbytes, __ATOMIC_RELAXED);
  emi_mem_count *c = device_count(S, st->device);
  if (c) __atomic_sub_fetch(&c->allocated, (int64_t)st->nbytes, __ATOMIC_RELAXED);
  if (st->ext_free) {            /* data from a buffer allocator, header on its own */
    st->ext_free(st->ext_ud, st->data, st->nbytes);
    emi_free(S, st, sizeof *st);
    return;
  }
  emi_device *d = emi_device_of(S, st->device);
  count_entry(S, d, EMI_ENTRY_free);
  d->backend->free(d, st);
}

/* -- Handles -------------------------------------------------------------------- */

void em_tensor_retain(em_tensor *t) { if (t) emi_atomic_inc(&t->refcount); }

void em_tensor_release(em_tensor *t) {
  if (!t || !last_reference(&t->refcount)) return;
  em_state *S = t->S;
  if (t->ag) emi_ag_release_fields(t);
  emi_storage_release(t->storage);
  emi_free(S, t, sizeof *t);
}

int em_tensor_ndim(const em_tensor *t) { return t->ndim; }
const int64_t *em_tensor_sizes(const em_tensor *t) { return t->sizes; }
const int64_t *em_tensor_strides(const em_tensor *t) { return t->strides; }
int64_t em_tensor_size(const em_tensor *t, int d) {
  if (d < 0) d += t->ndim;
  return d >= 0 && d < t->ndim ? t->sizes[d] : -1;
}
int64_t em_tensor_stride(const em_tensor *t, int d) {
  if (d < 0) d += t->ndim;
  return d >= 0 && d < t->ndim ? t->strides[d] : 0;
}
int64_t em_tensor_offset(const em_tensor *t) { return t->offset; }
int64_t em_tensor_numel(const em_tensor *t) { return t->numel; }
em_dtype em_tensor_dtype(const em_tensor *t) { return t->dtype; }
int em_tensor_device(const em_tensor *t) { return t->device; }
void *em_tensor_data(const em_tensor *t) {
  if (!t->storage->data) return NULL;         /* meta tensors, empty device tensors */
  return (char *)t->storage->data + t->offset * (int64_t)em_dtype_size(t->dtype);
}
int em_tensor_same_storage(const em_tensor *a, const em_tensor *b) {
  return a && b && a->storage == b->storage;
}
const void *em_tensor_storage_id(const em_tensor *t) { return t->storage; }
int64_t em_tensor_storage_nbytes(const em_tensor *t) { return (int64_t)t->storage->nbytes; }

int em_tensor_is_contiguous(const em_tensor *t) {
  if (t->numel == 0) return 1;               /* no element to be out of place (as PyTorch) */
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->sizes[d] == 1) continue;          /* stride of a size-1 dim is free */
    if (t->strides[d] != expect) return 0;
    /* Shapes are checked at creation (emi_shape_ok), but a view may carry sizes
    ** whose product does not fit: such a layout can't be contiguous, and signed
    ** overflow must not happen on the way to saying so. */
    if (__builtin_mul_overflow(expect, t->sizes[d], &expect)) return 0;
  }
  return 1;
}

/* The one element of t as bytes in buf (8 bytes): a device tensor is copied to
** the host first, which waits for the work that computes it. */
static em_status read_one(em_state *S, const em_tensor *t, unsigned char *buf) {
  if (!t || t->numel != 1)
    return emi_error(S, EM_ERR_SHAPE,
                     "item: expected a tensor with one element, got shape %s",
                     t ? emi_tshape(S, t) : "(none)");
  em_tensor *c = NULL;
  if (t->device != EM_CPU) {
    em_status st = em_to(S, t, t->dtype, EM_CPU, &c);
    if (st) return st;
    t = c;
  }
  memcpy(buf, em_tensor_data(t), em_dtype_size(t->dtype));
  em_tensor_release(c);
  return EM_OK;
}

em_status em_tensor_item(em_state *S, const em_tensor *t, double *out) {
  unsigned char b[8];
  em_status st = read_one(S, t, b);
  if (!st) *out = emi_load_f64(b, t->dtype);
  return st;
}

em_status em_tensor_item_int(em_state *S, const em_tensor *t, int64_t *out) {
  unsigned char b[8];
  em_status st = read_one(S, t, b);
  if (st) return st;
  switch (t->dtype) {
  case EM_INT64: { int64_t v; memcpy(&v, b, 8); *out = v; break; }
  case EM_INT32: { int32_t v; memcpy(&v, b, 4); *out = v; break; }
  default: *out = (int64_t)emi_load_f64(b, t->dtype);
  }
  return EM_OK;
}

/* -- Construction ------------------------------------------------------------------ */

/* Strides treat a size-0 dim as size 1, so an empty tensor still has the strides
** of a real layout; emi_shape_ok is what guarantees the products fit. For a
** shape that skipped that check the product saturates instead of overflowing (no
** UB); emi_tensor_view then refuses the shape. */
void emi_contiguous_strides(const int64_t *sizes, int ndim, int64_t *strides) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = s;
    if (__builtin_mul_overflow(s, sizes[d] > 0 ? sizes[d] : 1, &s)) s = INT64_MAX;
  }
}

/* True when every size is >= 0 and every stride product of the contiguous layout
** (size-0 dims counted as 1, as emi_contiguous_strides does), times 16 bytes (the
** widest element), fits in int64. Empty tensors are checked like any other: a
** zero dim must not hide [0, 2^62, 2^62], whose strides would overflow. */
bool emi_shape_ok(const int64_t *sizes, int ndim) {
  int64_t s = 16;
  for (int d = 0; d < ndim; d++)
    if (sizes[d] < 0 || __builtin_mul_overflow(s, sizes[d] > 0 ? sizes[d] : 1, &s))
      return false;
  return true;
}

int64_t emi_shape_numel(const int64_t *sizes, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  return n;
}

static em_status check_shape(em_state *S, const char *op, const int64_t *sizes, int ndim) {
  if (ndim < 0 || ndim > EM_MAX_DIMS)
    return emi_error(S, EM_ERR_SHAPE, "%s: %d dimensions (at most %d supported)", op,
                     ndim, EM_MAX_DIMS);
  for (int d = 0; d < ndim; d++)
    if (sizes[d] < 0)
      return emi_error(S, EM_ERR_SHAPE, "%s: negative size %lld in dimension %lld", op,
                       (long long)sizes[d], emi_ix(S, d));
  if (!emi_shape_ok(sizes, ndim)) {
    char b[EMI_SHAPE_STR];
    return emi_error(S, EM_ERR_SHAPE, "%s: shape %s is too large (its strides overflow "
                     "64-bit integers, even if a dimension is 0)", op,
                     emi_shape_str(b, sizes, ndim));
  }
  return EM_OK;
}

/* A handle over st (whose reference it takes) with contiguous geometry. */
static em_tensor *handle_new(em_state *S, emi_storage *st, const int64_t *sizes, int ndim,
                             em_dtype dt) {
  em_tensor *t = emi_malloc(S, sizeof *t);
  if (!t) return NULL;
  t->refcount = 1;
  t->dtype = dt;
  t->device = st->device;
  t->ndim = ndim;
  t->numel = emi_shape_numel(sizes, ndim);
  t->offset = 0;
  t->S = S;
  t->storage = st;
  emi_ag_clear_fields(t);
  for (int d = 0; d < ndim; d++) t->sizes[d] = sizes[d];
  emi_contiguous_strides(sizes, ndim, t->strides);
  return t;
}

static em_tensor *tensor_alloc(emi_device *d, const int64_t *sizes, int ndim, em_dtype dt,
                               bool *over) {
  em_state *S = d->S;
  size_t nbytes = (size_t)emi_shape_numel(sizes, ndim) * em_dtype_size(dt);
  emi_storage *st = storage_new(d, nbytes, over);
  if (!st) return NULL;
  em_tensor *t = handle_new(S, st, sizes, ndim, dt);
  if (!t) emi_storage_release(st);
  return t;
}

em_tensor *emi_tensor_try_new(em_state *S, const int64_t *sizes, int ndim, em_dtype dt) {
  bool over = false;
  return tensor_alloc(&S->cpu, sizes, ndim, dt, &over);
}

em_tensor *emi_tensor_try_external(em_state *S, void *data, size_t nbytes,
                                   void (*free_fn)(void *ud, void *p, size_t n), void *ud,
                                   const int64_t *sizes, int ndim, em_dtype dt) {
  emi_storage *st = emi_malloc(S, sizeof *st);
  if (!st) return NULL;
  memset(st, 0, sizeof *st);
  st->refcount = 1;
  st->device = EM_CPU;
  st->S = S;
  st->data = data;
  st->nbytes = nbytes;
  st->block_size = sizeof *st;
  st->ext_free = free_fn;
  st->ext_ud = ud;
  account(S, EM_CPU, nbytes, false);
  em_tensor *t = handle_new(S, st, sizes, ndim, dt);
  if (!t) {                       /* the caller still owns data on failure */
    st->ext_free = NULL;
    __atomic_sub_fetch(&S->mem_allocated, (int64_t)nbytes, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&S->cpu_mem.allocated, (int64_t)nbytes, __ATOMIC_RELAXED);
    emi_free(S, st, sizeof *st);
  }
  return t;
}

em_status emi_tensor_new(em_state *S, const char *op, const int64_t *sizes, int ndim,
                         em_dtype dt, int device, em_tensor **out) {
  em_status st = check_shape(S, op, sizes, ndim);
  if (st) return st;
  if ((unsigned)dt >= EM_NUM_DTYPES)
    return emi_error(S, EM_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
  emi_device *d = emi_device_of(S, device);
  if (__builtin_expect(!d, 0)) {
    if (device < EM_META)
      return emi_error(S, EM_ERR_DEVICE, "%s: invalid device %d (cpu is %d, meta %d, "
                       "CUDA devices are 0, 1, ...)", op, device, EM_CPU, EM_META);
    if (S->kinds[0].ctx && device < emi_accel_count(S))   /* there, but it would not open */
      return emi_error(S, EM_ERR_DEVICE, "%s: %s", op, emi_accel_why(S));
    if (S->kinds[0].ctx && device < EMI_MAX_DEVICES)
      return emi_error(S, EM_ERR_DEVICE, "%s: no device cuda:%d (this state has %d)", op,
                       device, emi_accel_count(S));
    return emi_error(S, EM_ERR_DEVICE, "%s: device cuda:%d is not available: %s", op,
                     device, emi_accel_why(S));
  }
  S->alloc_why[0] = 0;
  bool over = false;
  em_tensor *t = tensor_alloc(d, sizes, ndim, dt, &over);
  if (!t) {
    char b[EMI_SHAPE_STR];
    if (over) emi_cpu_limit_why(S, (size_t)emi_shape_numel(sizes, ndim) * em_dtype_size(dt));
    if (S->alloc_why[0])          /* the device allocator's own account */
      return emi_error(S, EM_ERR_NOMEM, "%s: %s (for a %s tensor of shape %s)", op,
                       S->alloc_why, em_dtype_name(dt), emi_shape_str(b, sizes, ndim));
    return emi_error(S, EM_ERR_NOMEM, "%s: out of memory allocating %zu bytes for a %s "
                     "tensor of shape %s", op,
                     (size_t)emi_shape_numel(sizes, ndim) * em_dtype_size(dt),
                     em_dtype_name(dt), emi_shape_str(b, sizes, ndim));
  }
  *out = t;
  return EM_OK;
}

em_tensor *emi_tensor_try_view(em_state *S, const em_tensor *src, const int64_t *sizes,
                               const int64_t *strides, int ndim, int64_t offset) {
  em_tensor *t = emi_malloc(S, sizeof *t);
  if (!t) return NULL;
  t->refcount = 1;
  t->dtype = src->dtype;
  t->device = src->device;
  t->ndim = ndim;
  t->offset = offset;
  t->S = S;
  emi_ag_clear_fields(t);
  for (int d = 0; d < ndim; d++) { t->sizes[d] = sizes[d]; t->strides[d] = strides[d]; }
  t->numel = emi_shape_numel(sizes, ndim);
  t->storage = src->storage;
  emi_atomic_inc(&t->storage->refcount);
  return t;
}

em_status emi_tensor_view(em_state *S, const em_tensor *src, const int64_t *sizes,
                          const int64_t *strides, int ndim, int64_t offset,
                          em_tensor **out) {
  /* A view of an empty tensor may take any shape with a 0 in it, so the size
  ** check of creation is repeated here: [0, 2^62, 2^62] must not get through. */
  if (__builtin_expect(!emi_shape_ok(sizes, ndim), 0)) {
    char b[EMI_SHAPE_STR];
    return emi_error(S, EM_ERR_SHAPE, "view: shape %s is too large (its strides overflow "
                     "64-bit integers, even if a dimension is 0)", emi_shape_str(b, sizes, ndim));
  }
  em_tensor *t = emi_tensor_try_view(S, src, sizes, strides, ndim, offset);
  if (!t) return emi_error(S, EM_ERR_NOMEM, "view: out of memory allocating a tensor");
  *out = t;
  return EM_OK;
}

em_status em_empty(em_state *S, const int64_t *shape, int ndim, em_dtype dt, int device,
                   em_tensor **out) {
  return emi_tensor_new(S, "empty", shape, ndim, dt, device, out);
}


/* -- Broadcasting ------------------------------------------------------------------ */

em_status emi_broadcast_shape(em_state *S, const char *op, const int64_t *a, int na,
                              const int64_t *b, int nb, int64_t *out, int *nout) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int ia = na - n + i, ib = nb - n + i;
    int64_t x = ia >= 0 ? a[ia] : 1, y = ib >= 0 ? b[ib] : 1;
    if (x != y && x != 1 && y != 1) {
      char sa[EMI_SHAPE_STR], sb[EMI_SHAPE_STR];
      return emi_error(S, EM_ERR_SHAPE,
                       "%s: shapes %s and %s can't be broadcast (dimension %lld: %lld vs %lld)",
                       op, emi_shape_str(sa, a, na), emi_shape_str(sb, b, nb), emi_ix(S, i),
                       (long long)x, (long long)y);
    }
    out[i] = x == 1 ? y : x;
  }
  *nout = n;
  return EM_OK;
}

em_status emi_expand_to(em_state *S, const char *op, const em_tensor *t,
                        const int64_t *shape, int ndim, em_tensor **out) {
  int64_t strides[EM_MAX_DIMS];
  if (t->ndim > ndim) goto bad;
  for (int i = 0; i < ndim; i++) {
    int j = t->ndim - ndim + i;
    if (j < 0) { strides[i] = 0; continue; }
    if (t->sizes[j] == shape[i]) strides[i] = t->strides[j];
    else if (t->sizes[j] == 1) strides[i] = 0;
    else goto bad;
  }
  return emi_tensor_view(S, t, shape, strides, ndim, t->offset, out);
bad:;
  char b[EMI_SHAPE_STR];
  return emi_error(S, EM_ERR_SHAPE, "%s: shape %s can't be broadcast to %s", op,
                   emi_tshape(S, t), emi_shape_str(b, shape, ndim));
}

/* -- Strided iteration -------------------------------------------------------------- */

static void iter_init(emi_iter *it, em_tensor *const *ops, int nops, bool by_memory) {
  const em_tensor *t0 = ops[0];
  it->nops = nops;
  int n = 0;
  /* Drop size-1 dims, then merge dim d into d+1 when, for every operand,
  ** stride[d] == stride[d+1] * size[d+1]. */
  for (int d = 0; d < t0->ndim; d++) {
    if (t0->sizes[d] == 1) continue;
    it->sizes[n] = t0->sizes[d];
    for (int k = 0; k < nops; k++)
      it->strides[k][n] = ops[k]->strides[d] * (int64_t)em_dtype_size(ops[k]->dtype);
    n++;
  }
  /* An output in another memory order than its dims' (a channels-last one): walk
  ** the dims in the output's memory order, so that the inner loop runs along its
  ** densest dim, as PyTorch's TensorIterator does. Only for outputs of positive
  ** strides that are out of order, and only for the callers that ask (element-wise
  ** kernels, where the order of visits does not matter): the usual case is left
  ** exactly as it was. */
  bool sorted = true, positive = by_memory;
  for (int d = 0; d < n; d++) {
    positive = positive && it->strides[0][d] > 0;
    if (d && it->strides[0][d] > it->strides[0][d - 1]) sorted = false;
  }
  if (!sorted && positive)
    for (int d = 1; d < n; d++)   /* insertion sort: stable, n <= EM_MAX_DIMS */
      for (int e = d; e > 0 && it->strides[0][e] > it->strides[0][e - 1]; e--) {
        int64_t s = it->sizes[e];
        it->sizes[e] = it->sizes[e - 1];
        it->sizes[e - 1] = s;
        for (int k = 0; k < nops; k++) {
          int64_t v = it->strides[k][e];
          it->strides[k][e] = it->strides[k][e - 1];
          it->strides[k][e - 1] = v;
        }
      }
  if (n == 0) {
    it->sizes[0] = t0->numel == 0 ? 0 : 1;
    for (int k = 0; k < nops; k++) it->strides[k][0] = 0;
    n = 1;
  }
  int m = 0;
  for (int d = 1; d < n; d++) {
    bool merge = true;
    for (int k = 0; k < nops && merge; k++)
      merge = it->strides[k][m] == it->strides[k][d] * it->sizes[d];
    if (merge) {
      it->sizes[m] *= it->sizes[d];
      for (int k = 0; k < nops; k++) it->strides[k][m] = it->strides[k][d];
    } else {
      m++;
      it->sizes[m] = it->sizes[d];
      for (int k = 0; k < nops; k++) it->strides[k][m] = it->strides[k][d];
    }
  }
  it->ndim = m + 1;
  for (int k = 0; k < nops; k++) it->base[k] = (char *)em_tensor_data(ops[k]);
  it->inner = it->sizes[it->ndim - 1];
  it->nrows = 1;
  for (int d = 0; d < it->ndim - 1; d++) it->nrows *= it->sizes[d];
  if (t0->numel == 0) it->nrows = 0;
}

void emi_iter_init(emi_iter *it, em_tensor *const *ops, int nops) {
  iter_init(it, ops, nops, false);
}

void emi_iter_init_by_memory(emi_iter *it, em_tensor *const *ops, int nops) {
  iter_init(it, ops, nops, true);
}

void emi_iter_row(const emi_iter *it, int64_t r, char **ptrs) {
  for (int k = 0; k < it->nops; k++) ptrs[k] = it->base[k];
  for (int d = it->ndim - 2; d >= 0 && r; d--) {
    int64_t i = r % it->sizes[d];
    r /= it->sizes[d];
    for (int k = 0; k < it->nops; k++) ptrs[k] += i * it->strides[k][d];
  }
}
