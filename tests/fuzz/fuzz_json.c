/*
** fuzz_json.c -- libFuzzer harness for the JSON pull parser that reads
** safetensors headers (core/io/json.h), on any text, and for the string quoting
** the writer uses. Three checks per input:
**  - emi_json_skip then emi_json_finish on the text (the validator);
**  - a walk with the typed calls the header reader makes (open/more/colon/
**    string/uint), falling back to skip for values they don't take: it must
**    never accept a text that the validator rejects;
**  - when the input is valid UTF-8 without NUL, quoting it (em_json_quote) and
**    reading the quoted form back (emi_json_string) gives the input again.
** Each parse gets its own copy of exactly n bytes: strings are decoded in place,
** and with no spare byte after the text, ASan sees any read past its end.
*/
#include "fuzz.h"
#include "io/json.h"
#include <stdlib.h>
#include <string.h>

enum { DEPTH = 64 };   /* as the safetensors reader */

static bool walk(emi_json *j);

static bool walk_container(emi_json *j, char open, char close) {
  if (!emi_json_open(j, open)) return false;
  int64_t count = 0;
  bool more;
  for (;;) {
    if (!emi_json_more(j, close, &count, &more)) return false;
    if (!more) return true;
    if (open == '{') {
      char *key;
      size_t len;
      if (!emi_json_string(j, &key, &len)) return false;
      if (strlen(key) != len) fuzz_fail("a key with an inner NUL was accepted");
      if (!emi_json_colon(j)) return false;
    }
    if (!walk(j)) return false;
  }
}

static bool walk(emi_json *j) {
  int c = emi_json_peek(j);
  if (c == '{') return walk_container(j, '{', '}');
  if (c == '[') return walk_container(j, '[', ']');
  if (c == '"') {
    char *s;
    size_t len;
    if (!emi_json_string(j, &s, &len)) return false;
    if (strlen(s) != len) fuzz_fail("a string with an inner NUL was accepted");
    return true;
  }
  if (c >= '0' && c <= '9') {
    /* An integer if emi_json_uint takes it, else back to where it began. */
    emi_json saved = *j;
    int64_t v;
    if (emi_json_uint(j, &v)) {
      if (v < 0) fuzz_fail("emi_json_uint gave %lld", (long long)v);
      return true;
    }
    *j = saved;
  }
  return emi_json_skip(j);
}

static char *copy(const uint8_t *data, size_t n) {
  char *p = malloc(n ? n : 1);
  if (p && n) memcpy(p, data, n);
  return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  emi_json j;
  char *a = copy(data, n), *b = copy(data, n);
  if (!a || !b) { free(a); free(b); return 0; }
  emi_json_init(&j, a, n, DEPTH);
  bool valid = emi_json_skip(&j) && emi_json_finish(&j);
  emi_json_init(&j, b, n, DEPTH);
  bool walked = walk(&j) && emi_json_finish(&j);
  if (walked && !valid) fuzz_fail("the typed walk accepted a text the validator rejects");
  free(a);
  free(b);

  /* Quoting round trip. */
  const char *s = (const char *)data;
  if (memchr(s, 0, n) || !em_utf8_valid(s, n)) return 0;
  size_t qn = em_json_quote(NULL, s, n);
  char *q = malloc(qn ? qn : 1);
  if (!q) return 0;
  if (em_json_quote(q, s, n) != qn) fuzz_fail("em_json_quote: two lengths");
  char *back;
  size_t len;
  emi_json_init(&j, q, qn, DEPTH);
  if (!emi_json_string(&j, &back, &len) || !emi_json_finish(&j))
    fuzz_fail("a quoted string does not parse back: %s", j.err);
  if (len != n || memcmp(back, s, n) != 0) fuzz_fail("quote then parse changed the string");
  free(q);
  return 0;
}
