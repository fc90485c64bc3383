/*
** grid.c -- the grid emulator: runs a kernel written with kernels/device.h,
** compiled for the host, over a CUDA grid, on the calling thread.
**
** Why fibers. A CUDA block is up to 1024 threads that meet at __syncthreads and
** whose warps meet at every shuffle. Running them as OS threads would make every
** barrier a futex storm and every run a different interleaving. Instead each CUDA
** thread of a block is a fiber -- a stack and a saved stack pointer -- and one
** scheduler on the launching thread switches between them. The switch
** (emk__ctx_switch below) is twelve instructions: push the six callee-saved
** registers, swap the stack pointer, pop, return; no signal mask, no syscall
** (swapcontext makes one per switch, which would dominate). Other architectures
** get ucontext.
**
** Two paths. Most kernels (element-wise, index ops) never wait for another
** thread; they are declared EMK_KERNEL and run each CUDA thread to completion as
** a plain call: no fibers, no stacks, tens of millions of threads a second. Only
** EMK_KERNEL_SYNC kernels get fibers. If a plain kernel reaches a barrier or a
** warp operation anyway, the launch fails with a message saying so (a longjmp
** back to the launch); it must not hang or silently race.
**
** Scheduling. Blocks run one after another, x fastest. Within a block the
** scheduler makes passes over the threads in thread order (EMBER_EMU_SCHEDULE=
** reverse: the other way), running each runnable thread until it yields at its
** next rendezvous or ends. So between two barriers thread 0 runs its whole phase
** before thread 1 starts: a thread reading shared memory that a later thread
** writes in the same phase -- a missing __syncthreads -- reads the poison every
** block starts with (EMK_SHARED_POISON), every time.
**   - __syncthreads: the thread counts itself in and yields. The last of the
**     block's threads to arrive makes all of them runnable again.
**   - warp operations (shuffles, votes, __syncwarp): the lane deposits its value
**     and parameter and yields; when every lane of its mask (lanes past the end
**     of the block do not exist and are dropped from it) has arrived with the
**     same operation and mask, each lane's result is computed at once and the
**     lanes become runnable. A lane reading from a lane outside the mask gets the
**     poison (CUDA: undefined). Two lanes arriving with masks that name each
**     other but differ, or with different operations, is an error at once.
**   - a pass in which nothing could run, before every thread ended, is a
**     deadlock: some threads wait at a barrier that the ones that exited will
**     never reach, or at a shuffle whose lanes are elsewhere. It is reported
**     with counts (reached by 16 of 32 threads) and the first thread that exited.
** Fibers live for the whole launch: a fiber whose thread ended yields back and,
** at the next block, runs the body again for its new thread, so only the first
** block pays for starting them.
**
** Memory. Stacks are one mmap per launch (EMK_FIBER_STACK bytes each, a
** PROT_NONE guard page below each: an overflow faults instead of corrupting the
** neighbour). Shared memory is one EMK_SHARED_MAX arena per launch: dynamic
** shared memory at its start, then each EMK_SHARED declaration, given its place
** the first time a thread runs it (found again by the address of a static
** object at the declaration). Every block starts by filling what is in use with
** the poison. Under ASan the unused rest of the arena and a redzone between
** declarations are poisoned for ASan too, so an overrun of a shared array is
** reported.
**
** Sanitizers. ASan must know which stack is current, or it takes fiber frames
** for stack overflows and misses use-after-return: every switch is bracketed by
** __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber. TSan runs
** a launch as one TSan fiber (__tsan_create_fiber, __tsan_switch_to_fiber; see
** run_fibers for why one). Both only when the build has them.
**
** No globals: a launch's state is its own (heap); the running launch, the CUDA
** indices and the pool of fibers are __thread variables, so stream threads run
** launches side by side.
*/
#define _GNU_SOURCE
#include "grid.h"
#include "../device.h"
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* -- Sanitizer hooks ---------------------------------------------------------------- */
#if defined(__SANITIZE_ADDRESS__)
#define EMK_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define EMK_TSAN 1
#endif
#ifdef __has_feature
#if __has_feature(address_sanitizer)
#define EMK_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define EMK_TSAN 1
#endif
#endif

#ifdef EMK_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define ASAN_START(fake, bottom, size) __sanitizer_start_switch_fiber((fake), (bottom), (size))
#define ASAN_FINISH(fake, bottom, size) __sanitizer_finish_switch_fiber((fake), (bottom), (size))
#define ASAN_POISON(p, n) __asan_poison_memory_region((p), (n))
#define ASAN_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define ASAN_START(fake, bottom, size) ((void)0)
#define ASAN_FINISH(fake, bottom, size) ((void)0)
#define ASAN_POISON(p, n) ((void)0)
#define ASAN_UNPOISON(p, n) ((void)0)
#endif

#ifdef EMK_TSAN
#include <sanitizer/tsan_interface.h>
#endif

/* Sanitized frames are larger (redzones, instrumentation). */
#if defined(EMK_ASAN) || defined(EMK_TSAN)
#define EMK_FIBER_STACK (256 * 1024)
#else
#define EMK_FIBER_STACK (64 * 1024)
#endif
#define EMK_MAX_SITES 64           /* EMK_SHARED declarations in one launch */
#define EMK_SHARED_ALIGN 16
#define EMK_REDZONE 32             /* between shared arrays, under ASan */

/* -- The context switch -------------------------------------------------------------- */
#if defined(__x86_64__) && !defined(EMK_FIBER_UCONTEXT)
/* emk__ctx_switch(&save_sp, new_sp): saves the callee-saved registers on the
** current stack, stores its pointer in *save_sp, and resumes the context whose
** stack pointer is new_sp. (The SSE and x87 control words are callee-saved too,
** but kernels never change them.) It leaves by an indirect jump, not `ret`: the
** return-stack predictor always guesses wrong across a stack switch, while the
** jump's few targets (where fibers park, where the scheduler resumes) are
** predicted well -- fibers run 2.5 times faster. A new context's stack holds six
** register slots and the address of emk__ctx_entry, which calls
** emk__fiber_main on an aligned stack; that never returns. */
__asm__(".pushsection .text\n"
        ".globl emk__ctx_switch\n"
        ".hidden emk__ctx_switch\n"
        ".type emk__ctx_switch,@function\n"
        ".p2align 4\n"
        "emk__ctx_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  popq %rax\n"
        "  jmpq *%rax\n"
        ".size emk__ctx_switch, .-emk__ctx_switch\n"
        ".globl emk__ctx_entry\n"
        ".hidden emk__ctx_entry\n"
        ".type emk__ctx_entry,@function\n"
        ".p2align 4\n"
        "emk__ctx_entry:\n"
        "  andq $-16, %rsp\n"
        "  call emk__fiber_main\n"
        "  ud2\n"
        ".size emk__ctx_entry, .-emk__ctx_entry\n"
        ".popsection\n");
__attribute__((visibility("hidden"))) void emk__ctx_switch(void **save_sp, void *new_sp);
__attribute__((visibility("hidden"))) void emk__ctx_entry(void);
typedef struct ctx { void *sp; } ctx;
#else
#include <ucontext.h>
typedef struct ctx { ucontext_t uc; } ctx;
#endif

/* -- Launch state ----------------------------------------------------------------- */
enum { F_RUN, F_BARRIER, F_WARP, F_DONE };

/* A fiber: a stack and a saved context, running emk__fiber_main's loop. The
** fields after `state` are the current launch's. */
typedef struct fiber {
  ctx c;
  unsigned char *stack;      /* lowest byte of its EMK_FIBER_STACK bytes */
  void *asan_fake;
  int state;
  unsigned tid;              /* linear: idx.x + block.x * (idx.y + block.y * idx.z) */
  emk_dim3 idx;              /* threadIdx */
} fiber;

/* The fibers of an OS thread. Kept between launches: mapping, guarding and
** first touching 256 stacks costs milliseconds (and under TSan creating 256
** fibers costs more), more than most launches. A parked fiber waits at the end
** of its loop and runs the next launch's body when resumed. Released when the
** thread exits (the C library's thread-exit destructors, which also keep this
** library loaded until then), when a launch needs more fibers, and after a
** failed launch, whose fibers stopped mid-body. */
typedef struct pool {
  fiber *f;
  unsigned n;
  unsigned char *stacks;     /* n slots: a PROT_NONE guard page, then a stack */
  size_t len;
  ctx sched;                 /* the OS thread's context while a fiber runs */
  const void *sched_bottom;  /* its stack, for ASan */
  size_t sched_size;
  void *sched_fake;
  void *tsan;                /* the TSan fiber all of them run as */
  int hooked;                /* its release at thread exit is registered */
} pool;

/* A warp's pending operations: lanes that arrived and wait, with what they gave. */
typedef struct warp {
  unsigned pending;          /* lanes waiting at a warp operation */
  unsigned exist;            /* lanes that exist (a block's last warp may be short) */
  unsigned char op[32], size[32], width[32];
  unsigned mask[32];         /* each waiting lane's mask, without absent lanes */
  int param[32];
  uint64_t val[32], out[32];
} warp;

typedef struct site { const void *key; size_t off, bytes; } site;

typedef struct launch {
  const emk_kernel *k;
  const void *args;
  emk_dim3 grid, block, bidx;
  unsigned nthreads, nwarps;
  int fibers;                /* 0: the plain path */
  int reverse;
  char *err;
  size_t errlen;
  em_status status;          /* the first error */
  int failed;
  jmp_buf jb;                /* the plain path's way out of a failing body */
  /* Shared memory: dynamic at smem[0, dyn), declarations after. */
  unsigned char *smem;
  size_t dyn, top, used;     /* top: next free offset; used: bytes without redzones */
  site sites[EMK_MAX_SITES];
  int nsites;
  /* Fibers: the thread's pool (or own_pool where the C library can't tell us
  ** when the thread exits). */
  pool *P;
  pool own_pool;
  fiber *cur;
  warp *w;
  unsigned narrived, ndone;  /* at the barrier; ended */
} launch;

static __thread launch *tls_launch;
static __thread pool tls_pool;
__thread emk_dim3 emk__thread_idx, emk__block_idx, emk__block_dim, emk__grid_dim;

/* -- Errors ---------------------------------------------------------------------- */
__attribute__((format(printf, 3, 4)))
static void fail(launch *L, em_status code, const char *fmt, ...) {
  if (L->failed) return;
  L->failed = 1;
  L->status = code;
  if (!L->err || !L->errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(L->err, L->errlen, fmt, ap);
  va_end(ap);
}

static const char *op_name(int op) {
  switch (op) {
  case EMK__SHFL_IDX: return "__shfl_sync";
  case EMK__SHFL_UP: return "__shfl_up_sync";
  case EMK__SHFL_DOWN: return "__shfl_down_sync";
  case EMK__SHFL_XOR: return "__shfl_xor_sync";
  case EMK__BALLOT: return "__ballot_sync";
  case EMK__ANY: return "__any_sync";
  case EMK__ALL: return "__all_sync";
  case EMK__SYNCWARP: return "__syncwarp";
  default: return "a warp operation";
  }
}

/* -- Fibers ------------------------------------------------------------------------ */
static void ctx_switch(ctx *from, ctx *to) {
#if defined(__x86_64__) && !defined(EMK_FIBER_UCONTEXT)
  emk__ctx_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
}

/* The scheduler runs f until it yields. */
static void resume(launch *L, fiber *f) {
  pool *P = L->P;
  L->cur = f;
  emk__thread_idx = f->idx;
  ASAN_START(&P->sched_fake, f->stack, EMK_FIBER_STACK);
  ctx_switch(&P->sched, &f->c);
  ASAN_FINISH(P->sched_fake, NULL, NULL);
}

/* f gives the scheduler back the thread; returns when resumed. */
static void yield(pool *P, fiber *f) {
  ASAN_START(&f->asan_fake, P->sched_bottom, P->sched_size);
  ctx_switch(&f->c, &P->sched);
  ASAN_FINISH(f->asan_fake, &P->sched_bottom, &P->sched_size);
}

/* A fiber's life: the current launch's body for one thread, then back to the
** scheduler; again at the next block or launch. */
__attribute__((visibility("hidden"), used)) void emk__fiber_main(void);
void emk__fiber_main(void) {
  launch *L = tls_launch;
  ASAN_FINISH(NULL, &L->P->sched_bottom, &L->P->sched_size);
  for (;;) {
    L = tls_launch;
    fiber *f = L->cur;
    L->k->host_body(L->args);
    f->state = F_DONE;
    L->ndone++;
    yield(L->P, f);
  }
}

/* A kernel's fault inside a body: leave it for good. */
static void leave_body(launch *L) {
  if (!L->fibers) longjmp(L->jb, 1);
  for (;;) yield(L->P, L->cur);   /* the scheduler sees L->failed and never resumes */
}

extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *obj, void *dso)
    __attribute__((weak));
extern void *__dso_handle __attribute__((visibility("hidden")));

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static void pool_release(pool *P) {
#ifdef EMK_TSAN
  if (P->tsan) __tsan_destroy_fiber(P->tsan);
  P->tsan = NULL;
#endif
  if (P->stacks) {
    /* Fibers stopped mid-body leave ASan's poison in their frames; the addresses
    ** will be reused. */
    ASAN_UNPOISON(P->stacks, P->len);
    munmap(P->stacks, P->len);
  }
  free(P->f);
  P->f = NULL;
  P->stacks = NULL;
  P->n = 0;
  P->len = 0;
}

static void pool_at_exit(void *p) { pool_release(p); }

/* At least n fibers in P, each parked at its start. */
static int pool_reserve(pool *P, unsigned n) {
  if (P->n >= n) return 1;
  pool_release(P);
  n = (n + 31) / 32 * 32;
  size_t page = page_size(), slot = page + EMK_FIBER_STACK, len = slot * n;
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) return 0;
  P->stacks = m;
  P->len = len;
  P->f = calloc(n, sizeof *P->f);
  if (!P->f) { pool_release(P); return 0; }
  P->n = n;
  for (unsigned i = 0; i < n; i++) {
    fiber *f = &P->f[i];
    unsigned char *lo = P->stacks + (size_t)i * slot;
    if (mprotect(lo, page, PROT_NONE) != 0) { pool_release(P); return 0; }
    f->stack = lo + page;
#if defined(__x86_64__) && !defined(EMK_FIBER_UCONTEXT)
    void **sp = (void **)(f->stack + EMK_FIBER_STACK);   /* 16-aligned */
    *--sp = NULL;                         /* emk__ctx_entry's return address */
    *--sp = (void *)emk__ctx_entry;       /* where the first switch goes */
    for (int r = 0; r < 6; r++) *--sp = NULL;   /* rbp rbx r12 r13 r14 r15 */
    f->c.sp = sp;
#else
    if (getcontext(&f->c.uc) != 0) { pool_release(P); return 0; }
    f->c.uc.uc_stack.ss_sp = f->stack;
    f->c.uc.uc_stack.ss_size = EMK_FIBER_STACK;
    f->c.uc.uc_link = NULL;
    makecontext(&f->c.uc, emk__fiber_main, 0);
#endif
  }
#ifdef EMK_TSAN
  P->tsan = __tsan_create_fiber(0);
#endif
  return 1;
}

static em_status fibers_open(launch *L) {
  unsigned n = L->nthreads;
  L->w = calloc(L->nwarps, sizeof *L->w);
  if (!L->w) return EM_ERR_NOMEM;
  if (__cxa_thread_atexit_impl) {
    L->P = &tls_pool;
    if (!tls_pool.hooked) {
      __cxa_thread_atexit_impl(pool_at_exit, &tls_pool, &__dso_handle);
      tls_pool.hooked = 1;
    }
  } else L->P = &L->own_pool;
  if (!pool_reserve(L->P, n)) return EM_ERR_NOMEM;
  for (unsigned i = 0; i < L->nwarps; i++) {
    unsigned lanes = n - 32 * i >= 32 ? 32 : n - 32 * i;
    L->w[i].exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  }
  unsigned bx = L->block.x, by = L->block.y;
  for (unsigned i = 0; i < n; i++) {
    fiber *f = &L->P->f[i];
    f->tid = i;
    f->idx = (emk_dim3){i % bx, i / bx % by, i / bx / by};
    f->state = F_DONE;
  }
  return EM_OK;
}

static void fibers_close(launch *L) {
  /* A failed launch's fibers stopped mid-body: they can't be resumed. */
  if (L->P && (L->failed || L->P == &L->own_pool)) pool_release(L->P);
  free(L->w);
}

/* -- Shared memory ------------------------------------------------------------------ */
static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* The arena: EMK_SHARED_MAX bytes, plus the redzones under ASan. */
static size_t arena_size(void) {
#ifdef EMK_ASAN
  return EMK_SHARED_MAX + EMK_MAX_SITES * (EMK_REDZONE + EMK_SHARED_ALIGN) + 64;
#else
  return EMK_SHARED_MAX + 64;
#endif
}

static void block_poison(launch *L) {
  memset(L->smem, EMK_SHARED_POISON, L->dyn);
  for (int i = 0; i < L->nsites; i++)
    memset(L->smem + L->sites[i].off, EMK_SHARED_POISON, L->sites[i].bytes);
}

void *emk__shared_dynamic(void) {
  launch *L = tls_launch;
  return L ? L->smem : NULL;
}

void *emk__shared_static(const void *key, size_t bytes, size_t align) {
  launch *L = tls_launch;
  if (!L) return NULL;
  for (int i = 0; i < L->nsites; i++)
    if (L->sites[i].key == key) return L->smem + L->sites[i].off;
  if (align < EMK_SHARED_ALIGN) align = EMK_SHARED_ALIGN;
  size_t used = round_up(L->used, align) + bytes;
  if (used > EMK_SHARED_MAX || L->nsites == EMK_MAX_SITES) {
    if (L->nsites == EMK_MAX_SITES)
      fail(L, EM_ERR_INTERNAL, "kernel %s: more than %d shared memory declarations",
           L->k->name, EMK_MAX_SITES);
    else
      fail(L, EM_ERR_INTERNAL,
           "kernel %s: shared memory: %zu bytes of dynamic and %zu of static shared "
           "memory exceed the %d bytes a block may use",
           L->k->name, L->dyn, used - round_up(L->dyn, EMK_SHARED_ALIGN),
           EMK_SHARED_MAX);
    leave_body(L);
  }
#ifdef EMK_ASAN
  size_t off = round_up(L->top + EMK_REDZONE, align);
#else
  size_t off = round_up(L->top, align);
#endif
  ASAN_UNPOISON(L->smem + off, bytes);
  memset(L->smem + off, EMK_SHARED_POISON, bytes);
  L->sites[L->nsites++] = (site){key, off, bytes};
  L->used = used;
  L->top = off + bytes;
  return L->smem + off;
}

/* -- Barriers and warp operations ------------------------------------------------------ */
void emk__syncthreads(void) {
  launch *L = tls_launch;
  if (!L) return;
  if (!L->fibers) {
    fail(L, EM_ERR_INTERNAL,
         "kernel %s uses __syncthreads but was not declared with EMK_KERNEL_SYNC",
         L->k->name);
    leave_body(L);
  }
  fiber *f = L->cur;
  f->state = F_BARRIER;
  if (++L->narrived == L->nthreads) {   /* the last one: everyone goes on */
    for (unsigned i = 0; i < L->nthreads; i++) L->P->f[i].state = F_RUN;
    L->narrived = 0;
  }
  yield(L->P, f);
}

/* The value lane reads in a completed operation of warp w over mask m. */
static uint64_t warp_result(const warp *w, unsigned m, unsigned votes, unsigned lane) {
  const uint64_t poison = 0x0101010101010101ull * EMK_SHARED_POISON;
  int op = w->op[lane], p = w->param[lane];
  unsigned width = w->width[lane], seg = lane & ~(width - 1), src;
  switch (op) {
  case EMK__SHFL_IDX: src = seg + ((unsigned)p & (width - 1)); break;
  case EMK__SHFL_UP:
    if (p < 0 || (unsigned)p > lane - seg) return w->val[lane];
    src = lane - (unsigned)p;
    break;
  case EMK__SHFL_DOWN:
    if (p < 0 || (lane - seg) + (unsigned)p >= width) return w->val[lane];
    src = lane + (unsigned)p;
    break;
  case EMK__SHFL_XOR:
    src = lane ^ ((unsigned)p & 31);
    if (src >= seg + width) return w->val[lane];   /* later groups: own value */
    break;
  case EMK__BALLOT: return votes;
  case EMK__ANY: return votes != 0;
  case EMK__ALL: return votes == m;
  default: return 0;
  }
  if (!(m >> src & 1)) return poison;   /* not taking part: undefined on a GPU */
  return w->val[src];
}

uint64_t emk__warp_op(int op, unsigned mask, uint64_t v, int size, int param, int width) {
  launch *L = tls_launch;
  if (!L) return v;
  if (!L->fibers) {
    fail(L, EM_ERR_INTERNAL, "kernel %s uses %s but was not declared with EMK_KERNEL_SYNC",
         L->k->name, op_name(op));
    leave_body(L);
  }
  fiber *f = L->cur;
  unsigned tid = f->tid, lane = tid % 32, bit = 1u << lane;
  warp *w = &L->w[tid / 32];
  unsigned m = mask & w->exist;
  emk_dim3 b = L->bidx;
  if (!(mask & bit)) {
    fail(L, EM_ERR_INTERNAL,
         "kernel %s: block (%u,%u,%u), warp %u: lane %u calls %s with mask 0x%08x, "
         "which does not include it",
         L->k->name, b.x, b.y, b.z, tid / 32, lane, op_name(op), mask);
    leave_body(L);
  }
  if (width < 1 || width > 32 || (width & (width - 1))) {
    fail(L, EM_ERR_INTERNAL, "kernel %s: %s with width %d (a power of 2 up to 32)",
         L->k->name, op_name(op), width);
    leave_body(L);
  }
  /* Every waiting lane this one names, or that names this one, must be at the
  ** same operation with the same mask. Usually all waiting lanes are in this
  ** lane's mask, and were checked against each other: one of them will do. */
  unsigned p = w->pending;
  if (p && !(p & ~m)) p &= -p;
  for (unsigned j; p; p &= p - 1) {
    j = (unsigned)__builtin_ctz(p);
    if (!((m >> j & 1) || (w->mask[j] & bit))) continue;
    if (w->op[j] != op || w->mask[j] != m || w->size[j] != size || w->width[j] != width) {
      fail(L, EM_ERR_INTERNAL,
           "kernel %s: block (%u,%u,%u), warp %u: lane %u calls %s with mask 0x%08x "
           "while lane %u waits at %s with mask 0x%08x",
           L->k->name, b.x, b.y, b.z, tid / 32, lane, op_name(op), mask, j,
           op_name(w->op[j]), w->mask[j]);
      leave_body(L);
    }
  }
  w->op[lane] = (unsigned char)op;
  w->size[lane] = (unsigned char)size;
  w->width[lane] = (unsigned char)width;
  w->mask[lane] = m;
  w->param[lane] = param;
  w->val[lane] = v;
  w->pending |= bit;
  f->state = F_WARP;
  if ((w->pending & m) == m) {   /* everyone is here */
    unsigned votes = 0;
    if (op == EMK__BALLOT || op == EMK__ANY || op == EMK__ALL)
      for (unsigned p = m, j; p; p &= p - 1) {
        j = (unsigned)__builtin_ctz(p);
        if (w->param[j]) votes |= 1u << j;
      }
    for (unsigned p = m, j; p; p &= p - 1) {
      j = (unsigned)__builtin_ctz(p);
      w->out[j] = warp_result(w, m, votes, j);
    }
    for (unsigned p = m, j; p; p &= p - 1) {
      j = (unsigned)__builtin_ctz(p);
      L->P->f[tid - lane + j].state = F_RUN;
    }
    w->pending &= ~m;
  }
  yield(L->P, f);
  return w->out[lane];
}

/* -- Running a block --------------------------------------------------------------------- */
static void describe_idx(const launch *L, unsigned tid, char *buf, size_t n) {
  snprintf(buf, n, "(%u,%u,%u)", tid % L->block.x, tid / L->block.x % L->block.y,
           tid / L->block.x / L->block.y);
}

/* Nothing can run and not every thread ended: say who waits for whom. */
static void deadlock(launch *L) {
  unsigned nb = 0, nw = 0, nd = 0, first_done = 0, first_warp = 0;
  int seen_done = 0, seen_warp = 0;
  for (unsigned i = 0; i < L->nthreads; i++) {
    int s = L->P->f[i].state;
    if (s == F_BARRIER) nb++;
    else if (s == F_WARP) { if (!seen_warp++) first_warp = i; nw++; }
    else if (s == F_DONE) { if (!seen_done++) first_done = i; nd++; }
  }
  emk_dim3 b = L->bidx;
  char who[48];
  if (nb) {
    char extra[160] = "";
    size_t k = 0;
    if (nd) {
      describe_idx(L, first_done, who, sizeof who);
      k += (size_t)snprintf(extra + k, sizeof extra - k,
                            "; %u exited without reaching it (the first: thread %s)", nd, who);
    }
    if (nw && k < sizeof extra) {
      describe_idx(L, first_warp, who, sizeof who);
      snprintf(extra + k, sizeof extra - k, "; %u wait at %s (the first: thread %s)", nw,
               op_name(L->w[first_warp / 32].op[first_warp % 32]), who);
    }
    fail(L, EM_ERR_INTERNAL,
         "kernel %s: block (%u,%u,%u): a barrier (__syncthreads) reached by %u of %u "
         "threads%s",
         L->k->name, b.x, b.y, b.z, nb, L->nthreads, extra);
    return;
  }
  /* Only warp operations wait: their missing lanes exited. */
  const warp *w = &L->w[first_warp / 32];
  unsigned lane = first_warp % 32, m = w->mask[lane], here = w->pending & m;
  fail(L, EM_ERR_INTERNAL,
       "kernel %s: block (%u,%u,%u), warp %u: %s with mask 0x%08x reached by lanes "
       "0x%08x; lanes 0x%08x exited without reaching it",
       L->k->name, b.x, b.y, b.z, first_warp / 32, op_name(w->op[lane]), m, here,
       m & ~here);
}

static void run_block_fibers(launch *L) {
  unsigned n = L->nthreads;
  for (unsigned i = 0; i < n; i++) L->P->f[i].state = F_RUN;
  for (unsigned i = 0; i < L->nwarps; i++) L->w[i].pending = 0;
  L->narrived = L->ndone = 0;
  for (;;) {
    int ran = 0;
    for (unsigned k = 0; k < n; k++) {
      fiber *f = &L->P->f[L->reverse ? n - 1 - k : k];
      if (f->state != F_RUN) continue;
      resume(L, f);
      if (L->failed) return;
      ran = 1;
    }
    if (L->ndone == n) return;
    if (!ran) { deadlock(L); return; }
  }
}

/* The plain path: each thread a call. Errors in a body longjmp here. */
static void run_plain(launch *L) {
  emk_dim3 g = L->grid, bl = L->block;
  void (*body)(const void *) = L->k->host_body;
  const void *args = L->args;
  if (setjmp(L->jb)) return;   /* L->failed is set */
  for (unsigned bz = 0; bz < g.z; bz++)
    for (unsigned by = 0; by < g.y; by++)
      for (unsigned bx = 0; bx < g.x; bx++) {
        emk__block_idx = L->bidx = (emk_dim3){bx, by, bz};
        block_poison(L);
        for (unsigned tz = 0; tz < bl.z; tz++)
          for (unsigned ty = 0; ty < bl.y; ty++) {
            emk__thread_idx.y = ty;
            emk__thread_idx.z = tz;
            for (unsigned tx = 0; tx < bl.x; tx++) {
              emk__thread_idx.x = tx;
              body(args);
            }
          }
      }
}

static void run_blocks(launch *L) {
  emk_dim3 g = L->grid;
  for (unsigned bz = 0; bz < g.z; bz++)
    for (unsigned by = 0; by < g.y; by++)
      for (unsigned bx = 0; bx < g.x; bx++) {
        emk__block_idx = L->bidx = (emk_dim3){bx, by, bz};
        block_poison(L);
        run_block_fibers(L);
        if (L->failed) return;
      }
}

/* Under TSan the whole launch, scheduler and CUDA threads, runs as the pool's
** one TSan fiber: switching TSan's context at every fiber switch costs
** microseconds (its vector clocks grow with the number of fibers), and the CUDA
** threads of a block are ordered by the schedule anyway. Each fiber's calls and
** returns are balanced, so the shared shadow call stack stays consistent (its
** deeper frames in reports may belong to another CUDA thread); a failed
** launch's unbalanced frames go with the pool. Accesses racing with other OS
** threads are still found. */
static void run_fibers(launch *L) {
#ifdef EMK_TSAN
  void *me = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(L->P->tsan, 0);
  run_blocks(L);
  __tsan_switch_to_fiber(me, 0);
#else
  run_blocks(L);
#endif
}

/* -- The entry --------------------------------------------------------------------------- */
static em_status refuse(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static em_status refuse(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return EM_ERR_ARG;
}

em_status emk_grid_run(const emk_kernel *k, emk_dim3 grid, emk_dim3 block,
                       size_t dyn_shared, const void *args, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!k) return refuse(err, errlen, "emk_grid_run: no kernel");
  const char *name = k->name ? k->name : "(unnamed)";
  if (!k->host_body)
    return refuse(err, errlen, "kernel %s has no host body (it was compiled by nvcc)", name);
  if (!block.x || !block.y || !block.z)
    return refuse(err, errlen, "kernel %s: block (%u,%u,%u) has a zero dimension", name,
                  block.x, block.y, block.z);
  if (!grid.x || !grid.y || !grid.z)
    return refuse(err, errlen, "kernel %s: grid (%u,%u,%u) has a zero dimension", name,
                  grid.x, grid.y, grid.z);
  unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
  if (nt > EMK_MAX_BLOCK_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64)
    return refuse(err, errlen,
                  "kernel %s: block (%u,%u,%u) has %llu threads; a block has at most %d "
                  "(x and y at most 1024, z at most 64)",
                  name, block.x, block.y, block.z, nt, EMK_MAX_BLOCK_THREADS);
  if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return refuse(err, errlen,
                  "kernel %s: grid (%u,%u,%u) is too large (x < 2^31, y and z <= 65535)", name,
                  grid.x, grid.y, grid.z);
  if (dyn_shared > EMK_SHARED_MAX)
    return refuse(err, errlen,
                  "kernel %s: %zu bytes of dynamic shared memory; a block may use at most %d",
                  name, dyn_shared, EMK_SHARED_MAX);
  if (tls_launch)   /* the thread's fibers and indices are the running kernel's */
    return refuse(err, errlen, "kernel %s launched from inside kernel %s", name,
                  tls_launch->k->name);

  launch *L = calloc(1, sizeof *L);
  if (!L) {
    if (err && errlen) snprintf(err, errlen, "kernel %s: out of host memory", name);
    return EM_ERR_NOMEM;
  }
  L->k = k;
  L->args = args;
  L->grid = grid;
  L->block = block;
  L->nthreads = (unsigned)nt;
  L->nwarps = (L->nthreads + 31) / 32;
  L->fibers = k->uses_barriers != 0;
  const char *sched = getenv("EMBER_EMU_SCHEDULE");
  L->reverse = sched && !strcmp(sched, "reverse");
  L->err = err;
  L->errlen = errlen;
  L->dyn = dyn_shared;
  L->used = L->top = round_up(dyn_shared, EMK_SHARED_ALIGN);

  em_status st = EM_OK;
  size_t asz = arena_size();
  L->smem = aligned_alloc(64, round_up(asz, 64));
  if (!L->smem) st = EM_ERR_NOMEM;
  else {
    ASAN_POISON(L->smem + dyn_shared, asz - dyn_shared);
    if (L->fibers) st = fibers_open(L);
  }
  if (st != EM_OK) {
    L->failed = 1;
    if (err && errlen)
      snprintf(err, errlen, "kernel %s: out of memory for %s", name,
               L->smem ? "the fibers of a block" : "shared memory");
  } else {
    tls_launch = L;
    emk__block_dim = block;
    emk__grid_dim = grid;
    if (L->fibers) run_fibers(L);
    else run_plain(L);
    tls_launch = NULL;
    if (L->failed) st = L->status;
  }
  if (L->fibers) fibers_close(L);
  if (L->smem) {
    ASAN_UNPOISON(L->smem, asz);
    free(L->smem);
  }
  free(L);
  return st;
}
