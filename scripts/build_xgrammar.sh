#!/usr/bin/env bash
# Builds xgrammar's C++ core (the grammar engine of constrained decoding, engine/structured/) as a
# static library from its pinned PyPI sdist, into a cache directory: never vendored, never committed.
#
#   scripts/build_xgrammar.sh [DIR]    prints the install prefix DIR/install
#                                      (DIR default: $TESSERA_PEERS or ~/.cache/tessera/peers, then xgrammar-<pin>)
#
# Only the library: no Python bindings (nanobind / tvm-ffi), no tests, no cpptrace. Its two
# third-party dependencies are header-only and ship inside the sdist (picojson, dlpack), so the build
# is offline once the sdist is there. `pip download --no-binary xgrammar` fetches the sdist of this
# one package (with --no-binary :all: pip would also build every build dependency from source).
# Idempotent: a build of the same sdist, flags and compiler is reused (stamp file). Set
# XGRAMMAR_SDIST to use a local copy of the sdist. CMake finds the result through
# -DTESSERA_XGRAMMAR_DIR (default: the same path).
set -euo pipefail
PIN=0.2.9
SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
DIR=${1:-${TESSERA_PEERS:-$HOME/.cache/tessera/peers}/xgrammar-$PIN}
JOBS=${JOBS:-2}
# -O2 rather than xgrammar's -O3, and no LTO: its -flto=auto would make every Tessera link re-run the
# optimizer over the library. -Wno-error: its -Werror is for its own CI's compilers.
CXXFLAGS_XG="-fno-lto -Wno-error"

say() { printf '[xgrammar] %s\n' "$*" >&2; }

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
sdist=$DIR/xgrammar-$PIN.tar.gz
prefix=$DIR/install
cmake_version=$(cmake --version)  # whole, then its first line: `| head -1` can SIGPIPE cmake under pipefail
stamp_text="$SHA256 Release $CXXFLAGS_XG $(g++ -dumpfullversion) ${cmake_version%%$'\n'*}"
if [ -f "$prefix/lib/libxgrammar.a" ] && [ "$(cat "$prefix/.stamp" 2>/dev/null)" = "$stamp_text" ]; then
  echo "$prefix"
  exit 0
fi

verified() { echo "$SHA256  $1" | sha256sum --check --status 2>/dev/null; }
if ! verified "$sdist"; then
  rm -f "$sdist"
  if [ -n "${XGRAMMAR_SDIST:-}" ]; then
    cp "$XGRAMMAR_SDIST" "$sdist.part"
    mv "$sdist.part" "$sdist"
  else
    say "fetching xgrammar==$PIN (sdist) with pip download"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary xgrammar \
      --dest "$DIR" "xgrammar==$PIN"
  fi
  verified "$sdist" || { say "sha256 mismatch for $sdist (expected $SHA256)"; rm -f "$sdist"; exit 1; }
fi

rm -rf "$DIR/src" "$DIR/build" "$prefix"
mkdir -p "$DIR/src" "$DIR/build"
tar xzf "$sdist" -C "$DIR/src" --strip-components=1
# xgrammar reads its options from config.cmake in the build directory first; its own cmake/config.cmake
# turns the Python bindings on.
cat >"$DIR/build/config.cmake" <<'CFG'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
CFG
say "building the C++ core with -j$JOBS (a few minutes on 2 cores)"
start=$(date +%s)
cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$CXXFLAGS_XG" \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_INSTALL_PREFIX="$prefix" >"$DIR/build/configure.log"
cmake --build "$DIR/build" -j"$JOBS" --target xgrammar >"$DIR/build/build.log" ||
  { tail -40 "$DIR/build/build.log" >&2; exit 1; }
cmake --install "$DIR/build" >/dev/null
# The library's license travels with the installed headers.
cp "$DIR/src/LICENSE" "$DIR/src/NOTICE" "$prefix/"
rm -rf "$DIR/build"
echo "$stamp_text" >"$prefix/.stamp"
say "built $prefix/lib/libxgrammar.a in $(($(date +%s) - start)) s"
echo "$prefix"
