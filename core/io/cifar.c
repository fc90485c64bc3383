/*
** cifar.c -- the CIFAR-10 binary format (em_data_cifar10): each batch file is a
** run of 3073-byte records, one label byte (0..9) then 32x32 red, green and blue
** planes, which is already the (3, 32, 32) layout of a uint8 image. All files
** are read into one images tensor (N, 3, 32, 32) and one int64 labels tensor
** (N) that an in-memory "cifar10" source serves.
**
** Sizes are checked before anything is read: a file whose size is not a whole
** number of records is reported with the record that is cut short.
*/
#include "../data/data.h"
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

enum { REC = 3073, IMG = 3072, CHUNK_RECS = 1024 };

static em_status file_records(em_state *S, const char *path, int64_t *nrec) {
  struct stat sb;
  if (stat(path, &sb) != 0) return emi_error(S, EM_ERR_IO, "cifar10: can't open '%s'", path);
  if (!S_ISREG(sb.st_mode))
    return emi_error(S, EM_ERR_IO, "cifar10: '%s' is not a regular file", path);
  int64_t size = (int64_t)sb.st_size;
  if (size == 0) return emi_error(S, EM_ERR_IO, "cifar10: '%s': empty file", path);
  if (size % REC)
    return emi_error(S, EM_ERR_IO,
                     "cifar10: '%s': truncated record %lld (file has %lld bytes, records "
                     "are %d)", path, (long long)(size / REC + 1), (long long)size, REC);
  *nrec = size / REC;
  return EM_OK;
}

/* Reads nrec records of path into images/labels from record `first` on. */
static em_status read_file(em_state *S, const char *path, int64_t nrec, uint8_t *images,
                           int64_t *labels, int label_base, unsigned char *chunk) {
  FILE *f = fopen(path, "rb");
  if (!f) return emi_error(S, EM_ERR_IO, "cifar10: can't open '%s'", path);
  for (int64_t r0 = 0; r0 < nrec; r0 += CHUNK_RECS) {
    int64_t k = nrec - r0 < CHUNK_RECS ? nrec - r0 : CHUNK_RECS;
    size_t got = fread(chunk, REC, (size_t)k, f);
    if (got != (size_t)k) {   /* the file shrank since it was measured */
      fclose(f);
      return emi_error(S, EM_ERR_IO, "cifar10: '%s': truncated record %lld", path,
                       (long long)(r0 + (int64_t)got + 1));
    }
    for (int64_t j = 0; j < k; j++) {
      const unsigned char *rec = chunk + j * REC;
      if (rec[0] > 9) {
        fclose(f);
        return emi_error(S, EM_ERR_IO, "cifar10: '%s': record %lld has label %d (labels "
                         "are 0..9)", path, (long long)(r0 + j + 1), rec[0]);
      }
      labels[r0 + j] = (int64_t)rec[0] + label_base;
      memcpy(images + (r0 + j) * IMG, rec + 1, IMG);
    }
  }
  fclose(f);
  return EM_OK;
}

em_status em_data_cifar10(em_state *S, const char *const *files, int nfiles,
                          int label_base, em_dataset **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "cifar10: out is required");
  *out = NULL;
  if (!files || nfiles < 1)
    return emi_error(S, EM_ERR_ARG, "cifar10: need at least one batch file");
  int64_t total = 0;
  for (int i = 0; i < nfiles; i++) {
    if (!files[i]) return emi_error(S, EM_ERR_ARG, "cifar10: file %d is NULL", i + 1);
    int64_t n = 0;
    em_status st = file_records(S, files[i], &n);
    if (st) return st;
    total += n;
  }
  em_tensor *fields[2] = {NULL, NULL};
  em_status st = em_empty(S, (const int64_t[]){total, 3, 32, 32}, 4, EM_UINT8, EM_CPU,
                          &fields[0]);
  if (!st) st = em_empty(S, (const int64_t[]){total}, 1, EM_INT64, EM_CPU, &fields[1]);
  unsigned char *chunk = NULL;
  if (!st && !(chunk = malloc((size_t)REC * CHUNK_RECS)))
    st = emi_error(S, EM_ERR_NOMEM, "cifar10: out of memory");
  int64_t at = 0;
  for (int i = 0; !st && i < nfiles; i++) {
    int64_t n = 0;
    st = file_records(S, files[i], &n);
    if (!st && at + n > total)
      st = emi_error(S, EM_ERR_IO, "cifar10: '%s' grew while being read", files[i]);
    if (!st)
      st = read_file(S, files[i], n, (uint8_t *)em_tensor_data(fields[0]) + at * IMG,
                     (int64_t *)em_tensor_data(fields[1]) + at, label_base, chunk);
    at += n;
  }
  free(chunk);
  if (!st) st = emi_data_tensors_kind(S, "cifar10", fields, 2, out);
  em_tensor_release(fields[0]);
  em_tensor_release(fields[1]);
  return st;
}
