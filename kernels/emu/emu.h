/*
** emu.h -- the emulated runtime's insides, shared by its files:
**   runtime_emu.c  the runtime object, device properties, device memory (the
**                  block tables, guards, capacity, failure injection), pinned
**                  host memory and the test hooks;
**   stream_emu.c   streams (a worker thread each), their work items, events,
**                  kernel launches and sticky errors;
**   gemm_emu.c     the gemm entry: OpenBLAS standing in for cuBLASLt, run as a
**                  work item on the stream's thread (emi_emu_queue_work);
**   dnn_emu.c      the nn entries: the CPU backend standing in for cuDNN's
**                  convolutions and batch norm, as work items too.
** Nothing here is seen outside kernels/emu/.
**
** Locks, always taken in this order (a thread holding one never waits for an
** earlier one): E->mu (the lists of streams and events, stream reference
** counts, event points) -> a stream's mu (its queue, counts and sticky error)
** -> E->mem_mu (the block tables) -> E->err_mu (rt->errmsg). A worker holds no
** lock while it runs an item, except a wait item, which holds only the other
** stream's mu while waiting on its condition variable.
*/
#ifndef EMBER_KERNELS_EMU_H
#define EMBER_KERNELS_EMU_H
#include "../runtime.h"
#include "../device.h"
#include <pthread.h>

/* The limits the device properties report and launches are checked against
** come from device.h (EMK_SHARED_MAX: 48 KiB, CUDA's default without opt-in),
** which the grid emulator enforces too. */
#define EMU_SHARED_PER_BLOCK ((size_t)EMK_SHARED_MAX)
#define EMU_MAX_BLOCK_THREADS EMK_MAX_BLOCK_THREADS
#define EMU_MAX_ARGS_SIZE ((size_t)32764)   /* CUDA 12.1's kernel parameter limit */

enum {
  EMU_ALIGN = 256,        /* device pointers are 256-byte aligned, as cudaMalloc's */
  EMU_HEAD = 256,         /* guard bytes before a block (keeps the alignment) */
  EMU_TAIL = 64,          /* guard bytes right after its last byte */
  EMU_HOST_ALIGN = 4096,  /* pinned host memory is page-aligned */
  EMU_FREED_RING = 64     /* recently freed blocks remembered for messages */
};

/* A live allocation: device memory (dev >= 0, with guards) or pinned host
** memory (dev == -1, raw == p, no guards). */
typedef struct emu_block {
  unsigned char *raw;     /* what the host allocator gave */
  unsigned char *p;       /* the pointer handed out */
  size_t n;               /* bytes asked for */
  int dev;
  unsigned long long id;  /* allocation number, for messages ("block #12") */
  int pins;               /* copies running on it right now (free waits for 0) */
} emu_block;

/* Live blocks of one device (or of pinned host memory), sorted by p. */
typedef struct emu_table {
  emu_block **v;
  size_t len, cap;
  size_t bytes;           /* sum of n (reserved ahead while an allocation is made) */
} emu_table;

typedef struct emu_freed { const unsigned char *p; size_t n; int dev; unsigned long long id; } emu_freed;

typedef struct emu_item emu_item;

/* The emulated definitions of runtime.h's opaque handles. */
struct emk_stream {
  unsigned magic;                 /* EMU_STREAM_MAGIC while its handle lives */
  struct emu *E;
  int dev;
  unsigned id;                    /* for messages: "cuda:0 stream 3" */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;         /* the worker waits for items (or stop) */
  pthread_cond_t done_cv;         /* waiters for `completed` to move */
  emu_item *head, *tail;
  unsigned long long queued;      /* items queued so far: the last one's sequence number */
  unsigned long long completed;   /* items finished: every item with seq <= this ran */
  int stop;                       /* the worker leaves once the queue is empty */
  /* The sticky error: the first failure since the last report. */
  em_status err;
  unsigned long long err_seq;     /* the item that failed */
  unsigned err_more;              /* failures after it, not reported separately */
  char errmsg[EMK_ERRMSG_SIZE];
  /* Under E->mu: references (the handle, events recorded on it, queued waits on
  ** it) and the list of streams whose handle lives. */
  int refs;
  struct emk_stream *prev, *next;
  /* Under mu: the graph being captured (capture_begin .. capture_end), or NULL. */
  struct emk_graph *capture;
};

struct emk_event {
  unsigned magic;
  int dev;
  struct emk_stream *s;           /* where it was last recorded (a reference), or NULL */
  unsigned long long target;      /* done once s->completed >= target */
  struct emk_event *prev, *next;  /* E->events */
};

typedef struct emu {
  emk_runtime rt;                 /* first: rt->impl points back here */
  int ndev;
  size_t capacity;                /* per device */
  pthread_mutex_t err_mu;
  /* memory */
  pthread_mutex_t mem_mu;
  pthread_cond_t mem_cv;          /* a pin was dropped */
  emu_table dev[EMK_MAX_DEVICES];
  emu_table host;                 /* pinned host memory */
  unsigned long long next_block;
  int fail_countdown;             /* emk_emu_fail_nth_malloc */
  /* Atomic: bit d once device d has a "context" (emi_emu_context), and the first
  ** such device (-1: none yet), which pinned host memory goes through. */
  unsigned contexts;
  int home;
  unsigned unavailable;           /* atomic: bit d refuses a new context (emk_emu_set_unavailable) */
  size_t pageable_copies;
  emu_freed freed[EMU_FREED_RING];
  unsigned freed_next;
  /* streams and events */
  pthread_mutex_t mu;
  struct emk_stream *streams;
  struct emk_event *events;
  unsigned next_stream;
} emu;

/* -- runtime_emu.c ------------------------------------------------------------------- */
/* rt->errmsg = the formatted message (under err_mu); returns code. */
em_status emi_emu_fail(emu *E, em_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Notes that device dev (valid) has a context now, as the real call `what` that
** brought the caller here would have made one on CUDA (runtime.h, Contexts); a
** device marked unavailable refuses a new one, as CUDA's EXCLUSIVE_PROCESS mode
** does when another process holds the GPU (EM_ERR_DEVICE, rt->errmsg set). */
em_status emi_emu_context(emu *E, int dev, const char *what);
/* Pins the live device block holding all of [p, p+n): 1, or 0 with why set. */
int emi_emu_pin(emu *E, const void *p, size_t n, emu_block **out, char *why, size_t whylen);
void emi_emu_unpin(emu *E, emu_block *b);
/* A kernel (or library call) queued on a stream of device dev reads every
** pointer it is given from dev; on CUDA another device's memory is an illegal
** address there unless peer access is on, which ember's kernels never rely on
** (cross-device data moves by memcpy_peer_async). So launches and library work
** look at each pointer-aligned word of their arguments [args, args+n): 1 with
** the word's offset and the device that owns it when one points into a live
** block of another device, else 0. A word is read as a pointer whatever its
** type; an integer or a double that equals a live device address of another
** device is not a value ember's arguments hold. */
int emi_emu_foreign_pointer(emu *E, const void *args, size_t n, int dev, size_t *off,
                            int *owner);
/* 1 (and why) when host range [p, p+n) overlaps device memory, guards included. */
int emi_emu_is_device(emu *E, const void *p, size_t n, char *why, size_t whylen);
/* 1 when host range [p, p+n) lies inside one block of pinned memory. */
int emi_emu_is_pinned(emu *E, const void *p, size_t n);
/* Counts a copy whose host side is not inside pinned memory. */
void emi_emu_note_host_side(emu *E, const void *p, size_t n);

/* -- stream_emu.c -------------------------------------------------------------------- */
em_status emi_emu_stream_create(emk_runtime *rt, int dev, emk_stream **out);
em_status emi_emu_stream_destroy(emk_runtime *rt, emk_stream *s);
em_status emi_emu_stream_sync(emk_runtime *rt, emk_stream *s);
em_status emi_emu_memcpy_async(emk_runtime *rt, void *dst, const void *src, size_t n,
                               emk_copy_kind kind, emk_stream *s);
em_status emi_emu_capture_begin(emk_runtime *rt, emk_stream *s);
em_status emi_emu_capture_end(emk_runtime *rt, emk_stream *s, emk_graph **out);
em_status emi_emu_graph_launch(emk_runtime *rt, emk_graph *g, emk_stream *s);
em_status emi_emu_graph_destroy(emk_runtime *rt, emk_graph *g);
em_status emi_emu_memcpy_peer_async(emk_runtime *rt, void *dst, int dst_dev,
                                    const void *src, int src_dev, size_t n, emk_stream *s);
em_status emi_emu_memset_async(emk_runtime *rt, void *dst, int byte, size_t n,
                               emk_stream *s);
em_status emi_emu_host_callback(emk_runtime *rt, emk_stream *s, void (*fn)(void *ud),
                                void *ud);
em_status emi_emu_event_create(emk_runtime *rt, int dev, emk_event **out);
em_status emi_emu_event_destroy(emk_runtime *rt, emk_event *e);
em_status emi_emu_event_record(emk_runtime *rt, emk_event *e, emk_stream *s);
em_status emi_emu_stream_wait_event(emk_runtime *rt, emk_stream *s, emk_event *e);
em_status emi_emu_event_query(emk_runtime *rt, emk_event *e, int *done);
em_status emi_emu_event_sync(emk_runtime *rt, emk_event *e);
em_status emi_emu_launch(emk_runtime *rt, const emk_kernel *k, emk_dim3 grid,
                         emk_dim3 block, size_t dyn_shared, emk_stream *s,
                         const void *args, size_t args_size);
/* Queues fn(E, args) on s's thread after the work before it (args, n bytes, is
** copied at the call); a failure (fn's status, message in err) becomes s's
** sticky error. For the CPU stand-ins of the libraries (gemm_emu.c). */
em_status emi_emu_queue_work(emu *E, emk_stream *s, const char *what,
                             em_status (*fn)(emu *E, void *args, char *err, size_t errlen),
                             const void *args, size_t n);
/* Waits until every stream of device dev (all devices: dev < 0) finished the
** work queued before the call: the implicit synchronisation of cudaFree. */
em_status emi_emu_drain(emu *E, int dev, const char *what);
/* Stops, drains and joins every stream, frees every event (close). */
void emi_emu_streams_close(emu *E);

/* -- gemm_emu.c ---------------------------------------------------------------------- */
em_status emi_emu_gemm(emk_runtime *rt, emk_stream *s, em_dtype dtype, int64_t m, int64_t n,
                       int64_t k, int64_t batch,
                       const void *a, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                       const void *b, int64_t b_rs, int64_t b_cs, int64_t b_bs,
                       void *c, int64_t c_rs, int64_t c_cs, int64_t c_bs, int allow_tf32);

#endif
