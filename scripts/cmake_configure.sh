# Sourced by scripts/test and scripts/fuzz: `configure_build DIR CMAKE_ARGS...` configures DIR with the
# Ninja generator and line-table debug info (TESSERA_DEBUG_INFO=lines, CMakeLists.txt). Why Ninja: one `cmake --build DIR --target a b c -j2` then builds the targets in
# parallel; the Makefile generator's top-level `.NOTPARALLEL` builds them one after another, which
# made each single-file test target of the sanitizer and fuzz stages a one-core build (most of their
# time in CI). A directory configured earlier with another generator keeps its other files (the
# ThreadSanitizer CAF build lives under build-tsan) and only loses its CMake cache.
configure_build() {
  local dir=$1
  shift
  if [ -f "$dir/CMakeCache.txt" ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
    echo "$dir: configured with another generator before; reconfiguring it for Ninja"
    rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
  fi
  # Line tables only (-g1): enough for every stack report the tests print, and faster to compile.
  cmake -G Ninja -S . -B "$dir" -DTESSERA_DEBUG_INFO=lines "$@" >/dev/null
}
