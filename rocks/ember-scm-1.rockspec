-- ember-scm-1.rockspec -- installs ember into a luarocks tree from a checkout:
--
--   luarocks --lua-version 5.1 --tree DIR make rocks/ember-scm-1.rockspec
--
-- (run at the top of the checkout). The build is the Makefile's portable one:
-- `make portable` builds for x86-64-v3 (AVX2 and FMA; the AVX-512 kernels are
-- chosen at run time), not for the building machine's CPU, so that the tree can
-- be copied to other x86-64 machines; it builds into build-portable/, the folder
-- that `make install` and tests/bench/gpu_pack.sh use for the same portable
-- build (one set of objects for all three). Then its
-- install-rock target copies the Lua modules into the tree's share/lua/5.1/ember/,
-- libember.so and libember_lua.so into lib/lua/5.1/ember/ (ember's Lua layer finds
-- them there through package.cpath, as `luarocks path` sets it), the `ember`
-- command into bin/, and docs/ into share/lua/5.1/ember/docs/ (where help() and
-- `ember --doc` look beside the Lua modules). LuaJIT only: the Lua layer is written on its FFI; the tree is
-- the 5.1 one because LuaJIT reads 5.1 paths.
rockspec_format = "3.0"
package = "ember"
version = "scm-1"
source = {
   -- Only `luarocks make` from a checkout is supported: there is no published
   -- repository for `luarocks install` to fetch.
   url = "git+file:///dev/null/ember.git",
}
description = {
   summary = "An embeddable deep learning toolkit: a C11 core scripted from LuaJIT",
   detailed = [[
      Tensors, CPU kernels on OpenBLAS, CUDA kernels, autograd, data loaders and
      collectives in a C core with one opaque state, scripted through LuaJIT's FFI.
   ]],
}
dependencies = {
   "lua == 5.1",   -- LuaJIT 2.1 reports itself as 5.1
}
build = {
   type = "make",
   build_target = "portable",
   -- NVCC= : the kernels' CUDA check build is for developers, not for installs.
   build_variables = { PORTABLE_BUILD = "build-portable", NVCC = "" },
   install_target = "install-rock",
   install_variables = {
      PORTABLE_BUILD = "build-portable", NVCC = "",
      LUADIR = "$(LUADIR)", LIBDIR = "$(LIBDIR)", BINDIR = "$(BINDIR)",
   },
}
