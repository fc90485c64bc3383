/*
** data.h -- what the files of core/data/ (and the file readers in core/io/ that
** feed them) share: dataset nodes, transforms, the per-thread context samples
** are computed in, and per-sample random streams. Nothing here is public API.
**
** Threads. Samples are computed on loader worker threads, concurrently with the
** consumer's own use of the state. So code reached from a `get` or an `apply`
** never calls emi_error (S->errmsg belongs to the consumer): it reports through
** emi_dfail into its context's err buffer, and the loader hands that message to
** the consumer. It allocates tensors with emi_dtensor_new (which is silent) and
** may use no other state-wide mutable thing (RNG offset, worker threads, grad mode).
**
** Datasets are immutable after construction, so many workers may `get` from one
** node at once; a node that caches something (shuffle's permutation) locks.
*/
#ifndef EMBER_DATA_H
#define EMBER_DATA_H
#include "../internal.h"

/* -- Per-thread context -------------------------------------------------------- */
typedef struct emi_dctx {
  em_state *S;
  int worker;                  /* 0 .., or -1 on the consumer's thread */
  int64_t epoch;
  /* Memory of assembled batches (the loader's buffer allocator), or NULL for
  ** the state's allocator. */
  void *(*buffer_alloc)(void *ud, size_t nbytes);
  void (*buffer_free)(void *ud, void *p, size_t nbytes);
  void *buffer_ud;
  char err[EMI_ERRMSG_SIZE];
} emi_dctx;

void emi_dctx_init(emi_dctx *c, em_state *S, int worker, int64_t epoch);
/* Formats into c->err and returns code: `return emi_dfail(c, EM_ERR_IO, ...)`. */
em_status emi_dfail(emi_dctx *c, em_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A new contiguous tensor from the state's allocator; on failure EM_ERR_NOMEM
** with a message naming op and shape in c->err. Safe on any thread. */
em_status emi_dtensor_new(emi_dctx *c, const char *op, const int64_t *sizes, int ndim,
                          em_dtype dt, em_tensor **out);
/* The same from the context's buffer allocator when it has one (batches). */
em_status emi_dbuffer_new(emi_dctx *c, const char *op, const int64_t *sizes, int ndim,
                          em_dtype dt, em_tensor **out);

/* -- Per-sample randomness -------------------------------------------------------
** A Philox stream keyed by a stage's seed whose counter encodes (epoch, index),
** so a sample's draws never depend on which worker computes it or when. */
typedef struct emi_drng {
  uint64_t key;
  uint32_t ctr[4];
  uint32_t buf[4];
  int left;
} emi_drng;
void emi_drng_init(emi_drng *r, uint64_t seed, int64_t epoch, int64_t index);
uint32_t emi_drng_u32(emi_drng *r);
double emi_drng_uniform(emi_drng *r);          /* [0, 1) with 53 random bits */
int64_t emi_drng_below(emi_drng *r, int64_t n); /* uniform in [0, n), n >= 1 */

/* -- Dataset nodes --------------------------------------------------------------- */
typedef struct emi_dataset_vt {
  const char *kind;
  /* Sample i (0 <= i < len) of c->epoch into out[0 .. nfields): new references. */
  em_status (*get)(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out);
  /* Optional fast path for batch: samples idx[0 .. n) stacked on a new first dim
  ** into out[0 .. nfields). Return EM_ERR_UNSUPPORTED (with no message) to make
  ** the caller fall back to `get` per sample. */
  em_status (*get_many)(em_dataset *d, emi_dctx *c, const int64_t *idx, int64_t n,
                        em_tensor **out);
  /* Frees impl and whatever it owns (parent is released by the caller). */
  void (*destroy)(em_dataset *d);
} emi_dataset_vt;

struct em_dataset {
  int refcount;                /* atomic */
  em_state *S;
  const emi_dataset_vt *vt;
  em_dataset *parent;          /* owned reference; NULL for sources */
  int64_t len;
  int nfields;
  int batched;                 /* items are batches (a batch stage at or below) */
  void *impl;
};

/* A node owning impl (destroyed through vt->destroy, also when this fails) and
** a reference to parent (retained here). Sets S's message on failure. */
em_status emi_dataset_new(em_state *S, const emi_dataset_vt *vt, em_dataset *parent,
                          int64_t len, int nfields, void *impl, em_dataset **out);
/* Sample i of d through its vt, with the index range-checked. */
em_status emi_dataset_get(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out);
/* Samples idx[0..n) stacked: get_many when d has it, else get per sample copied
** into batch buffers (emi_dbuffer_new). */
em_status emi_dataset_get_many(em_dataset *d, emi_dctx *c, const int64_t *idx,
                               int64_t n, em_tensor **out);

/* Copies src (any strides, CPU) into contiguous bytes at dst, in src's dtype. */

/* An in-memory source over tensors sharing their first dim (retained), named
** `kind` in messages ("tensors", "idx", "cifar10", "csv"). Sample i is a view of
** row i; get_many of consecutive rows is a view, else a gather. */
em_status emi_data_tensors_kind(em_state *S, const char *kind, em_tensor *const *fields,
                                int nfields, em_dataset **out);

/* -- Transforms ------------------------------------------------------------------
** apply works on fields in place: replacing fields[k] means releasing the old
** reference. Built-in transforms touch only fields[0]. Randomness comes only
** from rng; a compose passes the one stream along, so draws happen in order. */
typedef struct emi_transform_vt {
  const char *name;
  em_status (*apply)(em_transform *t, emi_dctx *c, emi_drng *rng, em_tensor **fields,
                     int nfields);
  void (*destroy)(em_transform *t);   /* frees impl's contents; may be NULL */
} emi_transform_vt;

struct em_transform {
  int refcount;                /* atomic */
  em_state *S;
  const emi_transform_vt *vt;
  void *impl;                  /* freed with emi_free after vt->destroy */
  size_t impl_size;
};

/* Takes ownership of impl (an emi_malloc block of impl_size bytes, or NULL). */
em_status emi_transform_new(em_state *S, const emi_transform_vt *vt, void *impl,
                            size_t impl_size, em_transform **out);
em_status emi_transform_run(em_transform *t, emi_dctx *c, emi_drng *rng,
                            em_tensor **fields, int nfields);

/* -- A loader's device side (feed.c) ----------------------------------------------
** em_loader_to_device gives a loader a feed: the pinned buffer pool its workers
** assemble batches in, and the queue of batches whose copies to the device run
** ahead of the consumer. All on the consumer's thread, except the pool's hooks. */
typedef struct emi_feed emi_feed;
/* ahead: batches copied before they are asked for (-1: the default, 1);
** buffers: the pinned buffers the pipeline needs, per its shape (see loader.c). */
em_status emi_feed_new(em_state *S, int device, int pin_memory, int ahead, int buffers,
                       emi_feed **out);
/* The pool's hooks for the loader's config (NULLs without pin_memory). */
void emi_feed_buffers(emi_feed *f, void *(**alloc)(void *, size_t),
                      void (**release)(void *, void *, size_t), void **ud);
/* The next batch on the device into out (*got = 0 at the end of the epoch);
** pulls from l with emi_loader_take. Errors set S's message. */
em_status emi_feed_next(em_state *S, emi_feed *f, em_loader *l, em_tensor **out, int *got);
void emi_feed_drop(emi_feed *f);   /* the epoch stopped: drops the batches queued */
void emi_feed_trim(emi_feed *f);   /* drop, wait for the copies, free the pool's buffers */
void emi_feed_stats(emi_feed *f, em_loader_stats *out);
void emi_feed_free(emi_feed *f);

/* loader.c, for the feed: the next item of the epoch into out (new references,
** *got = 0 at the end). wait = 0 takes it only when a worker has it ready (with
** no workers it is computed now; an error is then kept for the next call).
** Errors set S's message and stop the epoch. */
em_status emi_loader_take(em_state *S, em_loader *l, int wait, em_tensor **out, int *got);

#endif
