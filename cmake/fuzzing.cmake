# -DTESSERA_FUZZ=ON: the libFuzzer build of tests/fuzz (scripts/fuzz makes it in build-fuzz/). Every
# library is compiled with -fsanitize=fuzzer-no-link,address,undefined (coverage feedback and both
# sanitizers, without libFuzzer's main), the fuzz targets link with -fsanitize=fuzzer. UBSan does not
# recover, so its first report is a crash libFuzzer saves. Clang only: GCC has no libFuzzer.
option(TESSERA_FUZZ "Build tests/fuzz as libFuzzer targets (clang; see scripts/fuzz and docs/security.md)" OFF)
if(TESSERA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TESSERA_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang (scripts/fuzz does)")
  endif()
  if(NOT TESSERA_SANITIZE STREQUAL "")
    message(FATAL_ERROR "TESSERA_FUZZ=ON brings its own sanitizers (address+undefined); leave TESSERA_SANITIZE empty")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
