# ddp_folder(<target> <folder> [DEPS targets...] [PRIVATE_DEPS targets...] [EXCLUDE files...]):
# the static library of one source folder (docs/architecture.md). It holds every .cpp directly in
# the folder (sub-folders are libraries of their own); the folder's public headers live in its
# include/, its private ones beside the sources. Include paths come only from the targets named
# in DEPS, so a file that includes a folder its library does not depend on fails to compile:
# the layering is the build's, not a convention.
function(ddp_folder target folder)
  cmake_parse_arguments(F "" "" "DEPS;PRIVATE_DEPS;EXCLUDE" ${ARGN})
  set(dir ${CMAKE_CURRENT_SOURCE_DIR}/${folder})
  file(GLOB sources CONFIGURE_DEPENDS ${dir}/*.cpp)
  foreach(x IN LISTS F_EXCLUDE)
    list(REMOVE_ITEM sources ${dir}/${x})
  endforeach()
  add_library(${target} STATIC ${sources})
  if(EXISTS ${dir}/include)
    target_include_directories(${target} PUBLIC ${dir}/include)
  endif()
  # The folder itself: its private headers, for its own sources and for the folders (and tests)
  # that depend on it.
  target_include_directories(${target} PUBLIC ${dir})
  target_link_libraries(${target} PUBLIC ${F_DEPS} PRIVATE ${F_PRIVATE_DEPS})
  ddp_set_warnings(${target})
endfunction()

