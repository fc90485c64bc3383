/*
** resident.c -- tensors whose data comes and goes while the tensor stays: the
** parameters of a model sharded across replicas (em.distribute's 'parameters'
** mode), gathered in full for their module's forward and backward and freed in
** between.
**
** Why a storage of its own. Autograd keeps views of the tensors an op saved
** (a linear layer's weight, for its input's gradient), and those views hold the
** storage. Freeing a parameter's memory after its module's forward must not
** leave them pointing at freed memory, and gathering the parameter again for
** the backward must make them see it again. So the parameter gets a "resident"
** storage: a header of its own (emi_storage with ext_free = resident_free) whose
** data is an ordinary block of its device (ext_ud), allocated and freed without
** the header changing. Every view, saved or not, shares the header.
**
** Counting. The block counts its bytes in when made and out when released, as
** every storage does; the header counts nothing of its own. Its final release
** counts nbytes out like any storage's, then frees the block through
** resident_free -- so that callback puts the header's nbytes back, and the
** block's release takes out what the block had counted (none when the data was
** already freed).
**
** Safety while freed. The tensor handle reads as a meta tensor (device EM_META):
** every op either runs its shape logic without touching data, or fails naming
** the devices, or fails reading a value -- never a read of freed memory. Views
** made while the data was present keep their device; autograd's saved views are
** only read in a backward, and the sharded model fills the data before each
** module's backward (its pre-backward hook).
*/
#include "internal.h"
#include <string.h>

/* What a resident header's ext_ud points at: its block (NULL while freed). */
typedef struct resident_data {
  em_state *S;
  int device;
  emi_storage *block;
} resident_data;

/* The header's last release: it has just counted its nbytes out, which only the
** block (if any) had counted in, so they go back in and the block's own release
** takes out what it counted. */
static void resident_free(void *ud, void *data, size_t nbytes) {
  resident_data *r = ud;
  (void)data;
  emi_storage_account(r->S, r->device, (int64_t)nbytes);
  if (r->block) emi_storage_release(r->block);
  emi_free(r->S, r, sizeof *r);
}

uint32_t em_tensor_version(const em_tensor *t) {
  return __atomic_load_n(&t->storage->version, __ATOMIC_RELAXED);
}

int em_tensor_has_data(const em_tensor *t) {
  return t->device != EM_META && (t->storage->data != NULL || t->numel == 0);
}

static int resident(const emi_storage *st) { return st->ext_free == resident_free; }

/* t covers its whole storage: contiguous from offset 0, every byte. */
static em_status whole(em_state *S, const char *op, const em_tensor *t) {
  size_t nbytes = (size_t)t->numel * em_dtype_size(t->dtype);
  if (t->offset != 0 || !em_tensor_is_contiguous(t) || t->storage->nbytes != nbytes)
    return emi_error(S, EM_ERR_ARG, "%s: the tensor must be contiguous and own its whole "
                     "storage (got shape %s, offset %lld, %zu of %zu storage bytes)", op,
                     emi_tshape(S, t), (long long)t->offset, nbytes, t->storage->nbytes);
  return EM_OK;
}

/* Gives t's storage a header of its own (once); t must be its only handle. */
static em_status make_resident(em_state *S, const char *op, em_tensor *t) {
  emi_storage *st = t->storage;
  if (resident(st)) return EM_OK;
  if (st->ext_free || __atomic_load_n(&st->refcount, __ATOMIC_ACQUIRE) != 1 ||
      t->device == EM_META)
    return emi_error(S, EM_ERR_ARG, "%s: the tensor's storage is shared with other tensors "
                     "(views) or not its device's own; give it a fresh copy (clone) first",
                     op);
  emi_storage *h = emi_malloc(S, sizeof *h);
  resident_data *r = emi_malloc(S, sizeof *r);
  if (!h || !r) {
    emi_free(S, h, sizeof *h);
    emi_free(S, r, sizeof *r);
    return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
  }
  *r = (resident_data){S, st->device, st};
  *h = *st;
  h->refcount = 1;
  h->block_size = sizeof *h;
  h->ext_free = resident_free;
  h->ext_ud = r;
  t->storage = h;
  return EM_OK;
}

em_status em_tensor_free_data(em_state *S, em_tensor *t) {
  em_status st = emi_check_tensor(S, "free_data", t);
  if (st || (st = whole(S, "free_data", t))) return st;
  if ((st = make_resident(S, "free_data", t))) return st;
  emi_storage *h = t->storage;
  resident_data *r = h->ext_ud;
  if (r->block) {
    emi_storage_release(r->block);
    r->block = NULL;
    h->data = NULL;
  }
  t->device = EM_META;
  return EM_OK;
}

em_status em_tensor_fill_data(em_state *S, em_tensor *t, const em_tensor *src) {
  em_status st = emi_check_tensor(S, "fill_data", t);
  if (st || (st = emi_check_tensor(S, "fill_data", src)) || (st = whole(S, "fill_data", t)))
    return st;
  if ((st = make_resident(S, "fill_data", t))) return st;
  emi_storage *h = t->storage;
  if (src->ndim != t->ndim || memcmp(src->sizes, t->sizes, sizeof *t->sizes * (size_t)t->ndim))
    return emi_error(S, EM_ERR_SHAPE, "fill_data: the source has shape %s, the tensor %s",
                     emi_tshape(S, src), emi_tshape(S, t));
  if (src->device != h->device)
    return emi_error(S, EM_ERR_DEVICE, "fill_data: the source is on device %d, the tensor's "
                     "data belongs on %d", src->device, h->device);
  emi_device *d = emi_device_of(S, h->device);
  if (!d) return emi_error(S, EM_ERR_DEVICE, "fill_data: device %d has no backend", h->device);
  resident_data *r = h->ext_ud;
  if (!r->block) {
    S->alloc_why[0] = 0;
    emi_storage *block = emi_storage_new(d, h->nbytes);
    if (!block) {
      char b[EMI_SHAPE_STR];
      return emi_error(S, EM_ERR_NOMEM, "fill_data: %s (gathering a %s parameter of shape %s)",
                       S->alloc_why[0] ? S->alloc_why : "out of memory", em_dtype_name(t->dtype),
                       emi_shape_str(b, t->sizes, t->ndim));
    }
    r->block = block;
    h->data = block->data;
  }
  t->device = h->device;
  /* the saved views recorded this version: the values coming back are theirs */
  st = d->backend->copy(d, t, src);
  if (st) return st;
  return EM_OK;
}
