#!/usr/bin/env bash
# Builds libcaf_core 0.17.6 with ThreadSanitizer, for TSan runs of the actor tests (scripts/test).
#
# Why: Debian's libcaf_core.so is not instrumented, and the happens-before edge of every message (the
# mailbox enqueue/dequeue) happens inside it, so against the packaged library TSan reports every
# payload hand-off between actors as a race. With this library first on LD_LIBRARY_PATH (same soname,
# same headers and build_config.hpp as the Debian package, so the same ABI) TSan sees those edges and
# reports only real races.
#
#   actors/build_caf_tsan.sh <out-dir>
#   cmake -S . -B build-tsan -DTESSERA_SANITIZE=thread && cmake --build build-tsan --target actors_engine_facade_test
#   LD_LIBRARY_PATH=<out-dir>/lib build-tsan/tests/actors_engine_facade_test
#
# The source is the upstream release tarball of Debian's source package actor-framework 0.17.6-2.1
# (the one its libcaf-dev is built from), fetched through apt (scripts/apt-fetch-source) and pinned by
# the SHA-256 its .dsc lists. It is cached in <out-dir>, and so is the library: a rerun with the same
# tarball, flags, compiler and build_config.hpp does nothing. Set CAF_TARBALL to use a local copy.
set -euo pipefail

out=${1:?usage: build_caf_tsan.sh <out-dir>}
jobs=${JOBS:-$(nproc)}
caf_version=0.17.6
debian_version=${caf_version}-2.1
tarball_name=actor-framework_${caf_version}.orig.tar.gz
tarball_sha256=e2bf5bd243f08bb7d8adde197cfe3e6d71314ed3378fe0692f8932f4c3b3928c
package_build_config=/usr/include/caf/detail/build_config.hpp
cxxflags=(-std=c++17 -O1 -g0 -fPIC -fsanitize=thread -w)

mkdir -p "$out"
out=$(cd "$out" && pwd)
tarball=$out/$tarball_name
lib=$out/lib/libcaf_core.so.$caf_version

verified() { echo "$tarball_sha256  $1" | sha256sum --check --status; }

# ---- source ------------------------------------------------------------------------------------
if [ ! -f "$tarball" ] || ! verified "$tarball"; then
  rm -f "$tarball" "$tarball.part"
  if [ -n "${CAF_TARBALL:-}" ]; then
    cp "$CAF_TARBALL" "$tarball.part"
  else
    echo "fetching $tarball_name (Debian source package actor-framework $debian_version) through apt"
    "$(dirname "$0")/../scripts/apt-fetch-source" actor-framework "$debian_version" "$tarball_name" \
      "$tarball_sha256" "$tarball.part"
  fi
  if ! verified "$tarball.part"; then
    echo "build_caf_tsan: $tarball_name does not have the pinned SHA-256 $tarball_sha256" >&2
    rm -f "$tarball.part"
    exit 1
  fi
  mv "$tarball.part" "$tarball"
fi

# ---- cached library? -----------------------------------------------------------------------------
[ -f "$package_build_config" ] || { echo "build_caf_tsan: $package_build_config missing (install libcaf-dev)" >&2; exit 1; }
stamp_text="$tarball_sha256 ${cxxflags[*]} $(g++ -dumpfullversion) $(sha256sum <"$package_build_config")"
if [ -f "$lib" ] && [ "$(cat "$out/lib/.stamp" 2>/dev/null)" = "$stamp_text" ]; then
  echo "TSan libcaf_core up to date: $lib"
  exit 0
fi

# ---- build ------------------------------------------------------------------------------------
rm -rf "$out/src" "$out/obj" "$out/lib"
mkdir -p "$out/src" "$out/obj" "$out/lib"
tar -xzf "$tarball" -C "$out/src" --strip-components=1 "actor-framework-$caf_version/libcaf_core"
core=$out/src/libcaf_core
# The package's generated build configuration (log level, memory management, exceptions), so the
# library's ABI and behaviour match the headers Tessera compiles against.
cp "$package_build_config" "$core/caf/detail/build_config.hpp"
echo "compiling libcaf_core $caf_version with -fsanitize=thread ($jobs jobs)"
start=$(date +%s)
(cd "$core" && find src -name '*.cpp' | sort) | xargs -P"$jobs" -I{} bash -c \
  'o="$1/obj/$(echo "$2" | tr / _ | sed "s/\.cpp$/.o/")"; g++ "${@:4}" -I"$3" -c "$3/$2" -o "$o"' \
  _ "$out" {} "$core" "${cxxflags[@]}"
g++ -shared -fsanitize=thread -Wl,-soname,libcaf_core.so.$caf_version -Wl,--no-undefined \
  -o "$lib" "$out"/obj/*.o -lpthread
ln -sf "libcaf_core.so.$caf_version" "$out/lib/libcaf_core.so"
rm -rf "$out/obj"
echo "$stamp_text" >"$out/lib/.stamp"
echo "built $lib in $(($(date +%s) - start)) s"
