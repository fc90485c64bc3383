/*
** repl.c -- the interactive loop of the ember command, on libedit:
**
**  - prompt "> ", continuation ">> "; a chunk that fails to compile with an
**    error at <eof> is incomplete and reads another line;
**  - each line is tried first as "return <line>" (and "=expr" as in Lua 5.1),
**    so expressions print their values: several separated by tabs, through
**    print/tostring (tensors pretty-print);
**  - history in ~/.ember_history;
**  - Tab completes globals and fields: "em.ze" -> em.zeros, "t:su" -> t:sum,
**    the candidates computed by ember.repl.complete in Lua;
**  - Ctrl-C cancels the line being typed or interrupts the running code (see
**    main.c) and keeps the session; Ctrl-D on an empty line exits.
*/
#include "host.h"
#include <editline/readline.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static lua_State *replL;
static char history_file[4096];

/* -- Completion ------------------------------------------------------------------- */
/* readline's convention: [0] = the text to substitute (the common prefix of the
** candidates), then the candidates, then NULL. */
static char **complete(const char *text, int start, int end) {
  (void)start; (void)end;
  rl_attempted_completion_over = 1;     /* never fall back to file names */
  lua_State *L = replL;
  int top = lua_gettop(L);
  char **m = NULL;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "ember.repl");
  if (lua_pcall(L, 1, 1, 0) != 0) goto done;
  lua_getfield(L, -1, "complete");
  lua_pushstring(L, text);
  lua_pushstring(L, rl_line_buffer ? rl_line_buffer : "");
  if (lua_pcall(L, 2, 1, 0) != 0 || !lua_istable(L, -1)) goto done;
  size_t n = lua_objlen(L, -1);
  if (n == 0) goto done;
  m = calloc(n + 2, sizeof *m);
  if (!m) goto done;
  size_t common = 0;
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, (int)i);
    const char *s = lua_tostring(L, -1);
    m[i] = strdup(s ? s : "");
    lua_pop(L, 1);
    if (i == 1) common = strlen(m[1]);
    else {
      size_t k = 0;
      while (k < common && m[i][k] == m[1][k]) k++;
      common = k;
    }
  }
  m[0] = strndup(m[1], common);
  if (n == 1) { free(m[0]); m[0] = m[1]; m[1] = NULL; }
done:
  lua_settop(L, top);
  return m;
}

/* -- Reading chunks --------------------------------------------------------------- */
enum { LINE_OK = 0, LINE_EOF = -1, LINE_CANCEL = -2 };

/* Reads one line onto the stack. */
static int pushline(lua_State *L, int first) {
  ember_host_interrupted = 0;
  char *line = readline(first ? "> " : ">> ");
  if (ember_host_interrupted) {          /* Ctrl-C: drop what was typed */
    ember_host_interrupted = 0;
    free(line);
    fputs("\n", stdout);
    fflush(stdout);
    return LINE_CANCEL;
  }
  if (!line) return LINE_EOF;
  if (line[0]) {
    add_history(line);
    if (history_file[0]) write_history(history_file);
  }
  lua_pushstring(L, line);
  free(line);
  return LINE_OK;
}

static int incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  static const char eof[] = "'<eof>'";
  if (msg && len >= sizeof eof - 1 && strcmp(msg + len - (sizeof eof - 1), eof) == 0) {
    lua_pop(L, 1);
    return 1;
  }
  return 0;
}

/* If "return " .. the text at index 1 compiles, replaces the text by the
** function and returns 1. */
static int try_return(lua_State *L) {
  lua_pushliteral(L, "return ");
  lua_pushvalue(L, 1);
  lua_concat(L, 2);
  size_t len;
  const char *ret = lua_tolstring(L, -1, &len);
  if (luaL_loadbuffer(L, ret, len, "=stdin") == 0) {
    lua_replace(L, 1);                   /* the function replaces the text */
    lua_settop(L, 1);
    return 1;
  }
  lua_settop(L, 1);
  return 0;
}

/* Leaves a compiled chunk (status 0) or an error message on the stack, or
** returns LINE_EOF / LINE_CANCEL with the stack empty. */
static int loadline(lua_State *L) {
  lua_settop(L, 0);
  int r = pushline(L, 1);
  if (r != LINE_OK) return r;
  const char *line = lua_tostring(L, 1);
  if (line[0] == '=') {                  /* Lua 5.1's "=expr" */
    lua_pushstring(L, line + 1);
    lua_replace(L, 1);
  }
  for (;;) {
    /* An expression? Then print its values: "return <chunk>" first. */
    if (try_return(L)) return 0;
    size_t n;
    const char *buf = lua_tolstring(L, 1, &n);
    int status = luaL_loadbuffer(L, buf, n, "=stdin");
    if (!incomplete(L, status)) {
      lua_remove(L, 1);                  /* keep the chunk or the message */
      return status;
    }
    r = pushline(L, 0);
    if (r == LINE_CANCEL) { lua_settop(L, 0); return LINE_CANCEL; }
    if (r == LINE_EOF) {                 /* end of input inside a chunk */
      lua_settop(L, 0);
      return LINE_EOF;
    }
    lua_pushliteral(L, "\n");
    lua_insert(L, -2);
    lua_concat(L, 3);                    /* line .. "\n" .. next */
  }
}

/* Prints the values on the stack (results of a chunk) with the global print. */
static void print_results(lua_State *L) {
  int n = lua_gettop(L);
  if (n == 0) return;
  lua_getglobal(L, "print");
  lua_insert(L, 1);
  if (ember_host_docall(L, n, 0) != 0) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "ember: error printing the result: %s\n", msg ? msg : "?");
  }
  fflush(stdout);
}

int ember_repl(lua_State *L) {
  replL = L;
  rl_readline_name = "ember";
  rl_attempted_completion_function = complete;
  rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(+-*/%^~#,[)]}";
  rl_completion_append_character = '\0';
  using_history();
  stifle_history(2000);
  const char *home = getenv("HOME");
  history_file[0] = 0;
  if (home && *home) {
    snprintf(history_file, sizeof history_file, "%s/.ember_history", home);
    read_history(history_file);
  }
  for (;;) {
    int status = loadline(L);
    if (status == LINE_EOF) break;
    if (status == LINE_CANCEL) continue;
    if (status == 0) status = ember_host_docall(L, 0, LUA_MULTRET);
    if (status == 0) print_results(L);
    else ember_host_report(L, status);
    lua_settop(L, 0);
    if (ember_host_exit_requested(NULL)) break;   /* os.exit: the caller takes its code */
  }
  lua_settop(L, 0);
  fputs("\n", stdout);
  fflush(stdout);
  return 0;
}
