# meshtest_pch(<target> <group> <header>...): precompiled headers shared by a group of targets.
# The first target of a group precompiles the headers; every later target of the group reuses
# that PCH (REUSE_FROM), so the heavy third-party headers (Eigen, fmt, GoogleTest, MPI) are
# parsed once per group instead of once per file. The targets of a group must compile with the
# same flags (they do: one CMakeLists each). MESHTEST_PCH=OFF turns it off (clang-tidy runs,
# or to check that every file includes what it uses).
include_guard(GLOBAL)

option(MESHTEST_PCH "Precompile the common third-party headers once per group of targets" ON)

function(meshtest_pch target group)
  if(NOT MESHTEST_PCH)
    return()
  endif()
  get_property(owner GLOBAL PROPERTY MESHTEST_PCH_OWNER_${group})
  if(owner)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  else()
    target_precompile_headers(${target} PRIVATE ${ARGN})
    set_property(GLOBAL PROPERTY MESHTEST_PCH_OWNER_${group} ${target})
  endif()
endfunction()

# The headers of each group: what nearly every file of it includes.
set(MESHTEST_PCH_CORE <algorithm> <cmath> <cstdint> <functional> <map> <memory> <span> <string>
                      <string_view> <vector> <Eigen/Dense> <fmt/format.h> <fmt/ranges.h>)
set(MESHTEST_PCH_DIST ${MESHTEST_PCH_CORE} <mpi.h>)
set(MESHTEST_PCH_UNIT ${MESHTEST_PCH_CORE} <gtest/gtest.h> <gmock/gmock.h>
                      [["src/core/tensor.hpp"]])
set(MESHTEST_PCH_MPI ${MESHTEST_PCH_DIST} <gtest/gtest.h> <gmock/gmock.h>
                     [["src/core/tensor.hpp"]] [["dist/mesh/mesh_device.hpp"]])

# meshtest_gpu_test_folder(): the GPU test folders' code (tests/gpu, mpi_tests/gpu: every target
# of the calling folder) without the optimizer: CI (no GPU) only compiles it, and on a GPU machine
# its host code is thin (the library under test, built with the project's flags, does the work),
# so -O0 costs nothing there and saves CI about half of these files' compile time. Their
# programs' C++ files share one set of precompiled headers (group gpu_tests, both folders alike);
# a library's files take none (they compile with -fPIC, a program's with -fPIE, and GCC ignores a
# PCH built with the other), nor do .cu files (SKIP_PRECOMPILE_HEADERS on those that share a
# target with C++ files). Every target gets MESHTEST_SOURCE_DIR (the fixtures' root), one set of
# definitions for the shared headers.
function(meshtest_gpu_test_folder)
  get_property(targets DIRECTORY PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
    target_compile_definitions(${t} PRIVATE MESHTEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    get_target_property(sources ${t} SOURCES)
    get_target_property(type ${t} TYPE)
    list(FILTER sources INCLUDE REGEX "\\.cpp$")
    if(sources AND type STREQUAL "EXECUTABLE")
      meshtest_pch(${t} gpu_tests ${MESHTEST_PCH_UNIT})
    endif()
  endforeach()
endfunction()
