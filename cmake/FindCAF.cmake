# Finds the C++ Actor Framework (CAF). Debian's libcaf-dev (0.17.6) ships neither a CAFConfig.cmake
# nor a pkg-config file, so the headers and libcaf_core are located directly.
#   CAF::core  imported target (includes marked SYSTEM: CAF's headers warn under C++20)
#   CAF_FOUND, CAF_INCLUDE_DIR, CAF_CORE_LIBRARY, CAF_VERSION (from caf/config.hpp when readable)
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY caf_core)

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_version_line REGEX "^#define CAF_VERSION [0-9]+")
  if(_caf_version_line MATCHES "CAF_VERSION ([0-9]+)")
    math(EXPR _caf_major "${CMAKE_MATCH_1} / 10000")
    math(EXPR _caf_minor "(${CMAKE_MATCH_1} / 100) % 100")
    math(EXPR _caf_patch "${CMAKE_MATCH_1} % 100")
    set(CAF_VERSION "${_caf_major}.${_caf_minor}.${_caf_patch}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF REQUIRED_VARS CAF_CORE_LIBRARY CAF_INCLUDE_DIR VERSION_VAR CAF_VERSION)

if(CAF_FOUND AND NOT TARGET CAF::core)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES
    IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY)
