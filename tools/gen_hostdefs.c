/*
** gen_hostdefs.c -- prints the ffi.cdef declarations of the C library calls the
** Lua layer makes (realloc and free for the tensor registry, clock_gettime for
** em.clock, isatty for the loader's progress line), as this compiler sees them:
** the build compiles it, runs it and appends its output to
** build/lua/ember/hostdefs.lua.
**
** struct timespec's field sizes and offsets and CLOCK_MONOTONIC are asked of
** the compiler, not assumed. Each printed prototype has a twin here, a function
** pointer of the same type initialised with the library function, so a
** prototype that disagrees with the system's headers fails to compile. The
** names are em_host_* bound to the library's symbols with __asm__, so that a
** user's own cdef of realloc or isatty does not collide with them.
*/
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *(*const check_realloc)(void *, size_t) = realloc;
static void (*const check_free)(void *) = free;
static int (*const check_clock_gettime)(clockid_t, struct timespec *) = clock_gettime;
static int (*const check_isatty)(int) = isatty;

_Static_assert((clockid_t)-1 < 0, "clockid_t is printed as a signed integer");
_Static_assert((time_t)-1 < 0, "time_t is printed as a signed integer");

/* A field of n bytes at byte offset off, after padding from *at. */
static void field(const char *name, size_t off, size_t n, size_t *at, int *pads) {
  if (off > *at) printf("  uint8_t pad%d[%zu];\n", (*pads)++, off - *at);
  printf("  int%zu_t %s;\n", 8 * n, name);
  *at = off + n;
}

int main(void) {
  struct timespec ts;
  size_t at = 0;
  int pads = 0;
  (void)check_realloc; (void)check_free; (void)check_clock_gettime; (void)check_isatty;
  printf("-- The C library's side, by tools/gen_hostdefs.c. Do not edit.\n");
  printf("local ffi = require 'ffi'\nffi.cdef[==[\n");
  printf("typedef struct em_host_timespec {\n");
  field("tv_sec", offsetof(struct timespec, tv_sec), sizeof ts.tv_sec, &at, &pads);
  field("tv_nsec", offsetof(struct timespec, tv_nsec), sizeof ts.tv_nsec, &at, &pads);
  if (sizeof ts > at) printf("  uint8_t pad%d[%zu];\n", pads, sizeof ts - at);
  printf("} em_host_timespec;\n");
  printf("enum { EM_HOST_CLOCK_MONOTONIC = %d };\n", (int)CLOCK_MONOTONIC);
  printf("void *em_host_realloc(void *p, size_t n) __asm__(\"realloc\");\n");
  printf("void em_host_free(void *p) __asm__(\"free\");\n");
  printf("int em_host_clock_gettime(int%zu_t clock, em_host_timespec *ts) "
         "__asm__(\"clock_gettime\");\n", 8 * sizeof(clockid_t));
  printf("int em_host_isatty(int fd) __asm__(\"isatty\");\n");
  printf("]==]\n");
  return ferror(stdout) ? 1 : 0;
}
