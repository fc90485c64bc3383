/*
** json.h -- a small pull parser for JSON text that may be hostile (the header
** of a safetensors file), and the string quoting its writer needs. Internal to
** core/io/.
**
** There is no document tree: the caller walks the text with the schema it
** expects (emi_json_open / emi_json_more / emi_json_string / emi_json_uint),
** so memory use never depends on what the text claims, and skips what it does
** not know with emi_json_skip (depth-limited, allocation-free). Strings are
** decoded in place -- a decoded string is never longer than its quoted form --
** and NUL-terminated, so the buffer must be writable.
**
** Every function returns false on failure with j->err set to a short message
** and j->err_at to the byte offset of the problem; the caller adds context.
*/
#ifndef EMBER_IO_JSON_H
#define EMBER_IO_JSON_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct emi_json {
  char *begin, *p, *end;   /* the text and the cursor */
  int depth, max_depth;    /* open containers, and the most allowed */
  size_t err_at;
  char err[192];
} emi_json;

void emi_json_init(emi_json *j, char *text, size_t len, int max_depth);
/* Skips whitespace; the next byte, or -1 at the end of the text. */
int emi_json_peek(emi_json *j);
/* Records a failure at the cursor; always returns false. */
bool emi_json_fail(emi_json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "an object", "a string", ... for the value at the cursor (after whitespace). */
const char *emi_json_kind(emi_json *j);
/* Consumes '{' or '[' (given as open), counting the nesting depth. */
bool emi_json_open(emi_json *j, char open);
/* Inside a container opened with emi_json_open: *more = true when another
** element follows (the ',' between elements is consumed), false after the
** closing bracket (consumed). *count counts the elements seen, start it at 0. */
bool emi_json_more(emi_json *j, char close, int64_t *count, bool *more);
bool emi_json_colon(emi_json *j);
/* A string: decoded in place, NUL-terminated; *len excludes the NUL. Rejects
** control characters, bad escapes, lone surrogates, invalid UTF-8 and "\u0000"
** (callers hand the strings out as C strings). */
bool emi_json_string(emi_json *j, char **s, size_t *len);
/* A number that must be an integer in [0, INT64_MAX]: "-1", "2.5", "1e3" and
** oversized values fail with a message saying which. */
bool emi_json_uint(emi_json *j, int64_t *v);
/* Any value, checked but not kept. */
bool emi_json_skip(emi_json *j);
/* Only whitespace remains. */
bool emi_json_finish(emi_json *j);

/* -- Writing -------------------------------------------------------------------- */
/* s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or values past
** U+10FFFF). */
bool emi_utf8_valid(const char *s, size_t n);
/* Writes s[0..n) as a quoted JSON string into dst (when not NULL); returns the
** length of the quoted form. s must be valid UTF-8. */
size_t emi_json_quote(char *dst, const char *s, size_t n);

#endif
