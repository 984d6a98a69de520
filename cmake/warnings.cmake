# Warnings for our own targets only (third-party headers come in as SYSTEM includes).
# TESSERA_WERROR (on in scripts/test, so CI) turns them into errors.
option(TESSERA_WERROR "Treat compiler warnings in Tessera's own code as errors" OFF)
add_library(tessera_warnings INTERFACE)
target_compile_options(tessera_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor -Wno-missing-field-initializers>
  # GCC's spelling; clang (the fuzz build, cmake/fuzzing.cmake) has no -Wshadow=local.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>)
if(TESSERA_WERROR)
  target_compile_options(tessera_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
