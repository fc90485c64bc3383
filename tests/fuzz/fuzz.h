/*
** fuzz.h -- what the libFuzzer harnesses of tests/fuzz/ share: one em_state per
** process whose allocator refuses huge requests, the input handed to a parser as
** a file, and the checks every run ends with.
**
** ember's parsers take paths, not buffers, so the input is written to an
** in-memory file (memfd) and the parser opens it by name (/proc/self/fd/N): no
** disk, no temp-file clean-up, and each parser's own fopen/gzopen/open runs as
** it does on real files.
*/
#ifndef EMBER_FUZZ_H
#define EMBER_FUZZ_H
#include <ember.h>
#include <stddef.h>
#include <stdint.h>

/* Requests above this are refused by the state's allocator (a clean
** EM_ERR_NOMEM): a file may claim any size, and the fuzzer must go on past the
** refusal instead of stopping at an out-of-memory. Parsers that call malloc
** directly get the same limit from ASan (max_allocation_size_mb with
** allocator_may_return_null, set by tests/fuzz/run.sh). */
#define FUZZ_ALLOC_LIMIT ((size_t)256 << 20)

/* The process's state: one thread, no block cache (a cached block would hide a
** use-after-free from ASan and a leak from LeakSanitizer). */
em_state *fuzz_state(void);

/* Makes in-memory file k (0..FUZZ_MAX_FILES-1) hold data[0..n) and returns its
** path. The path stays valid for the process; its content is replaced by the
** next call for the same k. */
enum { FUZZ_MAX_FILES = 4 };
const char *fuzz_file(int k, const uint8_t *data, size_t n);

/* Ends a run: every tensor the parser made must have been released (ember's own
** count, beside LeakSanitizer's), else abort -- a finding. */
void fuzz_end(void);

/* Reads every byte of a CPU tensor's contiguous data, so that ASan checks the
** buffer the parser filled is as large as the tensor claims. */
void fuzz_touch(const em_tensor *t);

/* The image harnesses (fuzz_jpeg.c, fuzz_png.c): em_image_load on the input. */
int fuzz_image_one(const uint8_t *data, size_t n);

/* A failed internal-consistency check: prints why and aborts (a finding). */
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
