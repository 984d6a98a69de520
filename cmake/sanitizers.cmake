# -DTESSERA_SANITIZE=address|undefined|address+undefined|thread applies to every target in the tree
# but the CPU kernels (see the end of this file). UndefinedBehaviorSanitizer does not recover: the
# first report aborts the test, so a report cannot scroll past unnoticed.
if(TESSERA_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address)
elseif(TESSERA_SANITIZE STREQUAL "address+undefined")
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(TESSERA_SANITIZE STREQUAL "undefined")
  add_compile_options(-fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=undefined)
elseif(TESSERA_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread)
  add_link_options(-fsanitize=thread)
elseif(NOT TESSERA_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TESSERA_SANITIZE must be address, undefined, address+undefined or thread (got '${TESSERA_SANITIZE}')")
endif()

# GCC 12's -Wmaybe-uninitialized is unreliable once ASan/UBSan instrumentation is inlined at -O2: it
# reports Boost.Beast's basic_parser::content_length() (boost::none returned through an optional) from
# /usr/include, a false positive that the uninstrumented -Werror build does not see. Sanitizer builds
# check memory at run time, which is the stronger test of the same property; the warning stays on in
# every other build.
if(TESSERA_SANITIZE MATCHES "address|undefined" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options(-Wno-maybe-uninitialized)
endif()

if(NOT TESSERA_SANITIZE STREQUAL "")
  # -O1, as the sanitizers' own documentation advises: instrumented code stays fast enough for the
  # real-model e2e suites, and GCC compiles it in half the time of -O2 (ws_session.cpp under
  # ASan+UBSan: 80 s instead of 152 s on a CI core), which decides whether CI fits its 40 minutes.
  string(REPLACE "-O2" "-O1" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")
  string(REPLACE "-O2" "-O1" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")

  # The CPU executor's SIMD kernels (cpu/kernels_*.cpp) are built uninstrumented, at -O2: pure loops over
  # buffers that one execute() call partitions among its pool threads.
  # - ThreadSanitizer: instrumented, every vector load and store goes through TSan and the real-model
  #   actor tests run more than 30x slower (minutes per step batch on 2 cores). Left uninstrumented
  #   they are invisible to TSan, which can only hide races inside the kernels, never invent one; the
  #   thread pool that hands them work, the executor, the engine and the actors stay instrumented.
  # - ASan+UBSan: the three SIMD tables took 560 s of compile time (the AVX-512 one alone 312 s, the
  #   longest single step of CI) for code whose memory accesses the uninstrumented build already
  #   checks: tests/cpu/kernel_bounds_test.cpp runs every table with each buffer ending at a
  #   PROT_NONE page, so a read or write past what a kernel's contract allows faults there.
  # Set after cpu/ has been read (source properties are per directory).
  function(tessera_sanitizers_skip_kernels)
    file(GLOB kernels ${PROJECT_SOURCE_DIR}/cpu/kernels_*.cpp)
    set_source_files_properties(${kernels} DIRECTORY ${PROJECT_SOURCE_DIR}/cpu
                                PROPERTIES COMPILE_OPTIONS "-fno-sanitize=all;-O2")
  endfunction()
  cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL tessera_sanitizers_skip_kernels)
endif()
