#!/bin/sh
# check_comments.sh -- fails on a comment that names an issue number.
#
#   sh tools/check_comments.sh [DIR]      (DIR: the tree to check, default the checkout)
#
# Comments say what the code is and why, in the present tense. An issue number
# ("issue N", "issue #N", "issues N and M", "(issue N)", "issue no. N", N in digits)
# sends the reader to a tracker thread about what happened and goes stale with the
# code, so each one is listed as `file:line: text` (file relative to DIR) and the exit status
# is 1; 0 when there is none, 2 when DIR is not a directory. make test runs this on
# the checkout as one check (tests/lua/test_check_comments.lua).
#
# What is read: *.c *.h *.cu *.cuh *.cpp *.lua *.sh *.py, every Makefile and .ci/run,
# tests/ included; directories named .git or build* are skipped (build output).
# Only comments count: /* */ and // in C, C++ and CUDA; -- and --[[ ]] in Lua; # in
# shell, Python and Makefiles, and Python's triple-quoted strings (docstrings). String
# literals are skipped (a test's data may name an issue), and so are shell here-
# documents.
#
# Allowed on purpose: a URL of another project's issue
# (https://github.com/LuaJIT/LuaJIT/issues/1234) names that project and a fixed
# place, and stays true; the check wants a space or '#' between "issue" and the
# number, which "/issues/1234" has not. Not caught: a bare "#12", a phrase that
# breaks the line between "issue" and its number. The verb followed by a digit
# (a thread that may issue N loads, N in digits) reads as an issue number: write the
# count in words.

dir=${1:-$(cd "$(dirname "$0")/.." && pwd)}
[ -d "$dir" ] || { echo "check_comments.sh: $dir is not a directory" >&2; exit 2; }

# The same pattern twice: grep's picks the files worth scanning (most have no
# match anywhere), awk's tests each line's comment text, lower-cased.
grep_re='(^|[^[:alnum:]_])issues?([[:space:]]*#[[:space:]]*|[[:space:]]+(no\.?[[:space:]]*|number[[:space:]]+)?#?)[0-9]'

# The awk program: scans a file character by character, keeping the state a
# comment or string opens across lines, and builds each line's comment text
# (everything else blanked). lang: c, lua, sh, py or make.
scan='
function flush(   low) {
  low = tolower(com)
  if (low ~ /(^|[^a-z0-9_])issues?([ \t]*#[ \t]*|[ \t]+(no\.?[ \t]*|number[ \t]+)?#?)[0-9]/) {
    line = $0; sub(/^[ \t]+/, "", line)
    printf "%s:%d: %s\n", name, FNR, line
    found = 1
  }
}
FNR == 1 { st = ""; level = 0; heredoc = "" }
{
  com = ""; s = $0; n = length(s); i = 1
  if (heredoc != "") {                       # inside a here-document: data
    t = s; if (heredoc_tabs) sub(/^\t+/, "", t)
    if (t == heredoc) heredoc = ""
    next
  }
  # Only a shell string goes on past the end of its line (or one that ends in \).
  if (!cont && lang != "sh" && (st == "\"" || st == "'\''")) st = ""
  while (i <= n) {
    c = substr(s, i, 1)
    if (st == "block") {                     # C: /* ... */
      if (substr(s, i, 2) == "*/") { st = ""; i += 2; continue }
      com = com c; i++; continue
    }
    if (st == "line") { com = com c; i++; continue }
    if (st == "longcom" || st == "longstr") {  # Lua: --[==[ ]==] and [==[ ]==]
      close_ = "]" rep("=", level) "]"
      if (substr(s, i, length(close_)) == close_) { st = ""; i += length(close_); continue }
      if (st == "longcom") com = com c
      i++; continue
    }
    if (st == "doc") {                       # Python: """ or triple single quotes
      if (substr(s, i, 3) == quote3) { st = ""; i += 3; continue }
      com = com c; i++; continue
    }
    if (st == "\"" || st == "'\''") {           # a string literal
      if (c == "\\" && !(lang == "sh" && st == "'\''")) { i += 2; continue }
      if (c == st) st = ""
      i++; continue
    }
    # code
    if (lang == "c") {
      if (substr(s, i, 2) == "/*") { st = "block"; i += 2; continue }
      if (substr(s, i, 2) == "//") { st = "line"; i += 2; continue }
      if (c == "\"" || c == "'\''") { st = c; i++; continue }
      i++; continue
    }
    if (lang == "lua") {
      if (substr(s, i, 2) == "--") {
        if (match(substr(s, i + 2), /^\[=*\[/)) { level = RLENGTH - 2; st = "longcom"; i += 2 + RLENGTH; continue }
        st = "line"; i += 2; continue
      }
      if (match(substr(s, i), /^\[=*\[/)) { level = RLENGTH - 2; st = "longstr"; i += RLENGTH; continue }
      if (c == "\"" || c == "'\''") { st = c; i++; continue }
      if (c == "\\") { i += 2; continue }
      i++; continue
    }
    # sh, py, make: # opens a comment at the start of a word
    if (c == "\\") { i += 2; continue }
    if (lang == "py" && (substr(s, i, 3) == "\"\"\"" || substr(s, i, 3) == "'\'''\'''\''")) {
      quote3 = substr(s, i, 3); st = "doc"; i += 3; continue
    }
    if (c == "#" && (i == 1 || lang == "make" || lang == "py" || substr(s, i - 1, 1) ~ /[ \t;&|()`]/)) {
      st = "line"; i++; continue
    }
    if (lang == "sh" && substr(s, i, 3) == "<<<") { i += 3; continue }   # a here-string
    if (lang == "sh" && substr(s, i, 2) == "<<" && match(substr(s, i), /^<<-?[ \t]*["'\'']?[A-Za-z_][A-Za-z_0-9]*["'\'']?/)) {
      w = substr(s, i, RLENGTH); heredoc_tabs = (w ~ /^<<-/)
      sub(/^<<-?[ \t]*["'\'']?/, "", w); sub(/["'\'']$/, "", w); heredoc = w
      i += RLENGTH; continue
    }
    if (lang != "make" && (c == "\"" || c == "'\''")) { st = c; i++; continue }
    i++
  }
  if (st == "line") st = ""
  cont = (substr(s, n, 1) == "\\")
  if (com != "") flush()
}
function rep(ch, k,   r) { r = ""; while (k-- > 0) r = r ch; return r }
END { exit found ? 1 : 0 }
'

status=0
list=$(mktemp "${TMPDIR:-/tmp}/check_comments.XXXXXX") || exit 2
trap 'rm -f "$list"' EXIT INT TERM
( cd "$dir" && find . \( -type d \( -name .git -o -name 'build*' \) \) -prune -o -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \
       -o -name '*.lua' -o -name '*.sh' -o -name '*.py' -o -name Makefile -o -path ./.ci/run \) \
    -print | sed 's|^\./||' | sort ) > "$list"
while IFS= read -r f; do
  grep -Eiq "$grep_re" "$dir/$f" || continue
  case $f in
    *.c|*.h|*.cu|*.cuh|*.cpp) lang=c ;;
    *.lua) lang=lua ;;
    *.py) lang=py ;;
    Makefile|*/Makefile) lang=make ;;
    *) lang=sh ;;
  esac
  awk -v lang="$lang" -v name="$f" "$scan" "$dir/$f" || status=1
done < "$list"
if [ $status != 0 ]; then
  echo "check_comments.sh: the comments above name an issue number; say what the code is and why instead" >&2
fi
exit $status
