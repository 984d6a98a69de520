#!/usr/bin/env bash
# Builds libcaf_core 0.17.6 with ThreadSanitizer, for TSan runs of the actor tests.
#
# Debian's libcaf_core.so is not instrumented: the happens-before edge of every message (the mailbox
# enqueue/dequeue) happens inside it, so TSan reports every payload hand-off between actors as a
# race. With this library first on LD_LIBRARY_PATH (same soname, same headers and build_config.hpp
# as the Debian package), TSan sees those edges and reports only real races:
#
#   actors/build_caf_tsan.sh <caf-source-dir at tag 0.17.6> <out-dir>
#   cmake -S . -B build-tsan -DTESSERA_SANITIZE=thread && cmake --build build-tsan --target actors_engine_facade_test
#   LD_LIBRARY_PATH=<out-dir> build-tsan/tests/actors_engine_facade_test
set -euo pipefail
src=${1:?CAF source tree (git clone -b 0.17.6 https://github.com/actor-framework/actor-framework)}
out=${2:?output directory}
mkdir -p "$out/obj"
core="$src/libcaf_core"
# The package's generated build configuration (log level, exceptions), so the ABI matches the headers.
cp /usr/include/caf/detail/build_config.hpp "$core/caf/detail/build_config.hpp"
find "$core/src" -name '*.cpp' | while read -r f; do
  echo "$f"
done | xargs -P"$(nproc)" -I{} sh -c \
  'o="$1/obj/$(echo "$2" | tr / _).o"; g++ -std=c++17 -O1 -fPIC -fsanitize=thread -w -I"$3" -c "$2" -o "$o"' _ "$out" {} "$core"
g++ -shared -fsanitize=thread -Wl,-soname,libcaf_core.so.0.17.6 -Wl,--no-undefined \
  -o "$out/libcaf_core.so.0.17.6" "$out"/obj/*.o -lpthread
echo "built $out/libcaf_core.so.0.17.6"
