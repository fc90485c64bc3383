#!/bin/sh
# gen_cdefs.sh -- turn a header written to be FFI-parsable (core/include/ember.h,
# lua/host/ffi_exports.h) into a Lua chunk for ffi.cdef (build/lua/ember/cdefs.lua,
# the first part of hostdefs.lua): only preprocessor lines and the C++ guards
# have to go. Run by the Makefile (which then loads the result with
# luajit, so a declaration the FFI can't parse fails the build, not a user's
# script); never edit the output by hand.
set -e
echo "-- Generated from $1 by tools/gen_cdefs.sh. Do not edit."
echo "local ffi = require 'ffi'"
echo "ffi.cdef[==["
awk '
  /^#/ { next }
  /^extern "C" \{/ { next }
  /^\}$/ { next }
  { print }
' "$1"
echo "]==]"
