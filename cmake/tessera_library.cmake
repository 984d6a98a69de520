# tessera_library(): one CMake library per part of the tree, with its dependencies declared, and a
# layering check that makes an include the declaration does not allow fail the build.
#
#   tessera_library(tessera_text
#     FILES <globs relative to the calling CMakeLists.txt, headers and sources>
#     [EXCLUDE <globs>]              files the globs match that belong to another library
#     [DEPS <tessera libraries>]     what this library may include and links (PUBLIC)
#     [LINK <other targets>]         third-party libraries (PUBLIC)
#     [PRIVATE_LINK <targets>])
#
# The check (cmake/check_layers.py) runs before the library compiles: every `#include "a/b.hpp"` of
# the library's own files that names a file of another tessera_library must name one of DEPS or of
# their DEPS, transitively. So "engine/ must not need the Jinja interpreter" is a build error, not a
# review comment (docs/contributing.md shows the message).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
set_property(GLOBAL PROPERTY TESSERA_LAYER_LIBRARIES "")

function(tessera_library name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "FILES;EXCLUDE;DEPS;LINK;PRIVATE_LINK")
  set(globs)
  foreach(g ${arg_FILES})
    list(APPEND globs ${CMAKE_CURRENT_SOURCE_DIR}/${g})
  endforeach()
  file(GLOB files CONFIGURE_DEPENDS ${globs})
  foreach(g ${arg_EXCLUDE})
    file(GLOB excluded CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${g})
    if(excluded)
      list(REMOVE_ITEM files ${excluded})
    endif()
  endforeach()
  if(NOT files)
    message(FATAL_ERROR "tessera_library(${name}): no files match ${arg_FILES}")
  endif()
  set(sources ${files})
  list(FILTER sources INCLUDE REGEX "\\.(cpp|cu)$")

  if(sources)
    add_library(${name} STATIC ${files})
    target_link_libraries(${name} PUBLIC ${arg_DEPS} ${arg_LINK} PRIVATE ${arg_PRIVATE_LINK} tessera_warnings)
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  else()
    add_library(${name} INTERFACE ${files})
    target_link_libraries(${name} INTERFACE ${arg_DEPS} ${arg_LINK})
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
  endif()

  # The closure of what `name` may include: itself and its dependencies' closures.
  set(allowed ${name})
  foreach(dep ${arg_DEPS})
    get_property(dep_allowed GLOBAL PROPERTY TESSERA_LAYER_ALLOWED_${dep})
    if(NOT dep_allowed)
      message(FATAL_ERROR "tessera_library(${name}): dependency ${dep} is not a tessera_library declared before it")
    endif()
    list(APPEND allowed ${dep_allowed})
  endforeach()
  list(REMOVE_DUPLICATES allowed)
  set_property(GLOBAL PROPERTY TESSERA_LAYER_ALLOWED_${name} ${allowed})
  set_property(GLOBAL PROPERTY TESSERA_LAYER_FILES_${name} ${files})
  set_property(GLOBAL APPEND PROPERTY TESSERA_LAYER_LIBRARIES ${name})

  set(manifest ${PROJECT_BINARY_DIR}/layers/manifest.txt)
  set(stamp ${PROJECT_BINARY_DIR}/layers/${name}.ok)
  add_custom_command(
    OUTPUT ${stamp}
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/cmake/check_layers.py ${manifest} ${name} ${PROJECT_SOURCE_DIR}
    COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
    DEPENDS ${files} ${manifest} ${PROJECT_SOURCE_DIR}/cmake/check_layers.py
    COMMENT "Checking the includes of ${name} against its declared dependencies"
    VERBATIM)
  add_custom_target(${name}_layers DEPENDS ${stamp})
  add_dependencies(${name} ${name}_layers)
endfunction()

# Called once the whole tree is read: which library owns which file, and what each may include.
function(tessera_write_layer_manifest)
  get_property(libraries GLOBAL PROPERTY TESSERA_LAYER_LIBRARIES)
  set(text "")
  foreach(lib ${libraries})
    get_property(allowed GLOBAL PROPERTY TESSERA_LAYER_ALLOWED_${lib})
    get_property(files GLOBAL PROPERTY TESSERA_LAYER_FILES_${lib})
    string(JOIN " " allowed_text ${allowed})
    string(APPEND text "library ${lib} ${allowed_text}\n")
    foreach(f ${files})
      file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${f})
      string(APPEND text "file ${lib} ${rel}\n")
    endforeach()
  endforeach()
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/layers/manifest.txt CONTENT "${text}")
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL tessera_write_layer_manifest)
