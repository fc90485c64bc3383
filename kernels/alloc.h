/*
** alloc.h -- the caching device allocator of the CUDA backend.
**
** Asking the device runtime for memory (cudaMalloc) is slow and synchronises the
** device; freeing it (cudaFree) is worse. A training step allocates and frees the
** same few hundred tensors every time, so the backend keeps freed device memory
** and hands it out again. The allocator sits on the device runtime table
** (runtime.h) and nothing else, so the real CUDA runtime and the emulated one
** share it, and its tests run on a fake runtime of their own.
**
** Segments and blocks. Memory comes from the runtime in *segments*; a segment is
** cut into *blocks*, each either handed out, free, or waiting for events (below).
** Requests are rounded up to a multiple of 512 bytes, and go to one of two pools
** that never share a segment:
**   - small (rounded size <= 1 MiB): segments of 2 MiB, so that many small
**     tensors share one runtime allocation;
**   - large (> 1 MiB): requests below 10 MiB get a 20 MiB segment that later
**     mid-size requests share; from 10 MiB up, the segment is the request rounded
**     up to 2 MiB. When the runtime refuses the 20 MiB segment, the request's
**     own size rounded to 2 MiB is tried before anything else (small emulated
**     devices).
** This is the layout PyTorch's CUDACachingAllocator found to work; the code here
** is our own.
**
** Bins, splitting, merging. Free blocks are kept in size-class bins: eight
** classes per power of two (a two-level TLSF index: the power, then the top
** three bits below it), each bin a list sorted by size, with a bitmap of the
** non-empty bins. A request takes the smallest free block that fits (exact best
** fit: the first fitting block of its own bin, else the head of the next
** non-empty bin). A block larger than asked is split when the rest is worth
** keeping -- in the small pool any rest (>= 512 bytes), in the large pool a rest
** of more than 1 MiB (smaller rests stay with the block: splitting them would
** only fragment the large pool). A freed block merges at once with its free
** neighbours in the segment, so a segment whose blocks are all free is one
** block again, and only such whole segments are given back to the runtime.
**
** Streams. Every block belongs to the stream it was allocated for (a split
** inherits it). A freed block is reused immediately only by requests on that
** same stream: work queued on one stream runs in order, so a later kernel on S
** cannot touch the memory before the earlier kernels on S are done with it.
** Each device keeps one set of bins per stream. When the memory was also used on
** other streams (the caller says so with emk_alloc_record_stream), release
** records an event on each of those streams, and the block waits on the
** device's pending list. Pending blocks are polled (event_query) at the next
** allocation on that device and go back to their bins when all their events are
** done. Events are recycled, not destroyed. If an event can't be created or
** recorded, release waits for the stream instead (stream_sync): slower, but the
** memory is never reused early.
**
** Out of memory. When the runtime refuses a segment: (1) wait for the pending
** blocks' events and retry the bins, then give every whole free segment of the
** device back to the runtime and retry the runtime (an "OOM retry"); (2) if it
** still refuses, call the owner's oom_hook (the Lua layer makes LuaJIT collect
** garbage, which releases tensors), then retry the bins, the cache and the
** runtime once more; (3) only then fail with EM_ERR_NOMEM and a message naming
** the device, the size asked and what is allocated, cached and reserved:
**   "cuda:0: out of memory allocating 512.00 MiB (1.25 GiB allocated by tensors,
**    256.00 MiB cached, 1.50 GiB reserved, 2.00 GiB capacity)"
** Nothing is lost by a failure: the allocator stays usable.
**
** Pressure. When the bytes handed out on a device rise past pressure_fraction
** (default 0.8) of its memory, pressure_hook is called once, so that LuaJIT
** collects garbage before the device runs out; it is armed again when the
** allocated bytes fall below 90 % of that threshold.
**
** Hooks run on the thread that called emk_alloc_malloc, with no lock of the
** allocator held: they may release memory (that is their purpose) but must not
** allocate on the device whose allocation called them.
**
** Failures. The allocator's own bookkeeping (block records, per-stream bins,
** the pointer table) comes from the owner's em_alloc_fn. Each failure point is
** handled: an allocation whose bookkeeping can't be had fails with EM_ERR_NOMEM
** and leaves nothing behind; a split whose record can't be had is skipped (the
** block is handed out whole); a pointer table that can't grow keeps its size
** (longer chains). Nothing aborts.
**
** Threads. Every function may be called from any thread, except that
** emk_alloc_close must not run beside any other call. One mutex per device, one
** for the pointer table. The allocator may wait for a device's streams while it
** holds that device's mutex (the runtime's free synchronises, as cudaFree does;
** the OOM path waits for pending events), so work queued on a stream -- a
** host_callback -- must never call the allocator.
**
** Streams are keys. A stream's bins outlive it: destroy a stream only after its
** work drained (stream_destroy does), and a later stream at the same address
** simply inherits the cached blocks, which is safe.
*/
#ifndef EMBER_KERNELS_ALLOC_H
#define EMBER_KERNELS_ALLOC_H
#include "runtime.h"
#include <stddef.h>
#include <stdint.h>

typedef struct emk_alloc emk_alloc;

/* Sizes of the design above. */
enum {
  EMK_ALLOC_ROUND = 512,                     /* requests rounded up to this */
  EMK_ALLOC_SMALL = 1 << 20,                 /* small pool: rounded size <= this */
  EMK_ALLOC_SMALL_SEGMENT = 2 << 20,         /* segment of the small pool */
  EMK_ALLOC_MID_SEGMENT = 20 << 20,          /* segment for 1 MiB < size < 10 MiB */
  EMK_ALLOC_LARGE_MIN = 10 << 20,            /* from here: size rounded to 2 MiB */
  EMK_ALLOC_LARGE_ROUND = 2 << 20
};

typedef struct emk_alloc_config {
  /* Host memory for the bookkeeping (lua_Alloc contract, see ember.h); NULL =
  ** malloc/free. */
  em_alloc_fn host_alloc;
  void *host_ud;
  /* Called when the runtime refused memory even after the cache was emptied;
  ** the allocation is retried once after it returns. */
  void (*oom_hook)(void *ud, int dev, size_t nbytes);
  /* Called when the allocated bytes rise past pressure_fraction of capacity. */
  void (*pressure_hook)(void *ud, int dev, size_t allocated, size_t capacity);
  void *hook_ud;
  double pressure_fraction;    /* 0 = 0.8; >= 1 or < 0: never */
} emk_alloc_config;

/* Per-device numbers. Byte counts are of rounded block sizes unless named
** requested. "Cached" memory is reserved - allocated. */
typedef struct emk_alloc_stats {
  size_t capacity;             /* the device's memory (0 when the runtime can't tell) */
  size_t allocated;            /* bytes in blocks handed out */
  size_t requested;            /* bytes asked for by those blocks (before rounding) */
  size_t reserved;             /* bytes in segments held from the runtime */
  size_t pending;              /* bytes released but waiting for events */
  size_t peak_allocated, peak_reserved;   /* since open or emk_alloc_reset_peak */
  int64_t num_allocs, num_frees;          /* successful malloc / release calls */
  int64_t cache_hits;          /* allocations served without the runtime's malloc */
  int64_t segment_allocs, segment_frees;  /* runtime malloc / free of segments */
  int64_t oom_retries;         /* times the cache was emptied to retry the runtime */
  int64_t oom_hook_calls, pressure_hook_calls;
  int64_t ooms;                /* allocations that failed with EM_ERR_NOMEM */
  int64_t segments;            /* segments held now */
  int64_t active_blocks;       /* blocks handed out now */
  int64_t free_blocks;         /* blocks in the bins now */
  int64_t pending_blocks;      /* blocks waiting for events now */
  int64_t stream_syncs;        /* releases that waited for a stream (no event) */
} emk_alloc_stats;

/* A new allocator over rt's devices (cfg may be NULL). err (may be NULL) gets a
** message on failure. */
em_status emk_alloc_new(emk_runtime *rt, const emk_alloc_config *cfg, emk_alloc **out,
                        char *err, size_t errlen);
/* Waits for pending events, gives every segment back to the runtime and frees
** the allocator. Blocks still handed out are reclaimed too; returns how many there
** were (0 for a caller that released everything). The runtime's streams must be
** drained. NULL is a no-op. */
int64_t emk_alloc_close(emk_alloc *a);

/* Device memory of n bytes for use on stream s (NULL = the default stream): *out
** is aligned as the runtime's segments are (256 bytes for CUDA and the emulator),
** blocks lie at multiples of 512 inside them. n == 0 gives *out = NULL and EM_OK. On failure *out is
** NULL and err (may be NULL) says why; see "Out of memory" above. */
em_status emk_alloc_malloc(emk_alloc *a, int dev, size_t n, emk_stream *s, void **out,
                           char *err, size_t errlen);
/* Gives back a pointer emk_alloc_malloc returned (NULL is a no-op). The block
** remembers its device and stream. EM_ERR_ARG for a pointer this allocator did not
** hand out (or released twice). Otherwise EM_OK, or the error of a stream's earlier
** work that surfaced while the events were recorded (the block is released anyway,
** safely). */
em_status emk_alloc_release(emk_alloc *a, void *p, char *err, size_t errlen);
/* p (as emk_alloc_malloc returned it) is used by work queued on stream s as well:
** its release will wait for that work. EM_ERR_ARG for an unknown pointer,
** EM_ERR_NOMEM when the bookkeeping can't be had. */
em_status emk_alloc_record_stream(emk_alloc *a, void *p, emk_stream *s, char *err,
                                  size_t errlen);

/* Gives the device's whole free segments back to the runtime (dev -1: every
** device). Blocks waiting for events stay until their events are done. Also frees
** the spare bookkeeping records. EM_OK, or the runtime's error of a free (that
** segment stays cached). */
em_status emk_alloc_empty_cache(emk_alloc *a, int dev, char *err, size_t errlen);
em_status emk_alloc_stats_get(emk_alloc *a, int dev, emk_alloc_stats *out);
void emk_alloc_reset_peak(emk_alloc *a, int dev);
/* Replaces the hooks (not while another thread allocates). */
void emk_alloc_set_hooks(emk_alloc *a, void (*oom_hook)(void *, int, size_t),
                         void (*pressure_hook)(void *, int, size_t, size_t), void *ud);

/* The size of the block behind p (n rounded, or more when a split wasn't worth
** it); 0 for an unknown pointer. */
size_t emk_alloc_block_size(emk_alloc *a, const void *p);
/* The rounding rules: the block size and the segment size for a request of n
** bytes (0 on overflow). */
size_t emk_alloc_round(size_t n);
size_t emk_alloc_segment_size(size_t n);

#endif
