# install.cmake — the meshtest CMake package (included when MESHTEST_INSTALL is ON: by default
# only when meshtest is the top-level project).
# Installs the libraries, the headers (include/meshtest/{src,dist}/...), the
# test-registration helper and meshtestConfig.cmake, and writes the same config
# into the build tree, so that find_package(meshtest) works with
# -Dmeshtest_DIR=<build dir> and with -DCMAKE_PREFIX_PATH=<install prefix>.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MESHTEST_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/meshtest
    CACHE STRING "Where meshtestConfig.cmake is installed, relative to the prefix")

# meshtest_warnings joins the export set only because the build-tree export
# keeps the $<BUILD_INTERFACE:meshtest_warnings> that the libraries link
# privately; there it is $<LINK_ONLY:...> of an empty INTERFACE target, so
# consumers get no warning flags from it. (The install export drops it.)
set_target_properties(meshtest_warnings PROPERTIES EXPORT_NAME warnings)
install(TARGETS meshtest_core meshtest meshtest_gtest_main meshtest_fused_kit meshtest_warnings
  EXPORT meshtestTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Headers keep their repo-root-relative paths: #include "dist/ccl/all_reduce.hpp"
# resolves against include/meshtest (the INSTALL_INTERFACE of meshtest_core).
file(GLOB_RECURSE MESHTEST_PUBLIC_HEADERS CONFIGURE_DEPENDS
  RELATIVE ${PROJECT_SOURCE_DIR}
  ${PROJECT_SOURCE_DIR}/src/*.hpp ${PROJECT_SOURCE_DIR}/dist/*.hpp)
if(NOT MESHTEST_CUDA_ENABLED)  # the GPU side's headers only with its libraries
  list(FILTER MESHTEST_PUBLIC_HEADERS EXCLUDE REGEX "^(src|dist|dist/testing)/gpu/")
endif()
foreach(header IN LISTS MESHTEST_PUBLIC_HEADERS)
  get_filename_component(header_dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/meshtest/${header_dir})
endforeach()

install(EXPORT meshtestTargets
  NAMESPACE meshtest::
  FILE meshtestTargets.cmake
  DESTINATION ${MESHTEST_INSTALL_CMAKEDIR})

# The GPU side, when built: the component gpu (meshtest::gpu and meshtest::dist_gpu), in a
# targets file of its own that meshtestConfig.cmake includes only when the component is asked
# for (after finding CUDAToolkit, and NCCL by the FindNCCL.cmake installed beside it).
if(MESHTEST_CUDA_ENABLED)
  install(TARGETS meshtest_gpu meshtest_dist_gpu meshtest_gpu_gtest_main
    EXPORT meshtestGpuTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT meshtestGpuTargets
    NAMESPACE meshtest::
    FILE meshtestGpuTargets.cmake
    DESTINATION ${MESHTEST_INSTALL_CMAKEDIR})
  export(EXPORT meshtestGpuTargets
    NAMESPACE meshtest::
    FILE ${PROJECT_BINARY_DIR}/meshtestGpuTargets.cmake)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake DESTINATION ${MESHTEST_INSTALL_CMAKEDIR})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake ${PROJECT_BINARY_DIR}/FindNCCL.cmake
                 COPYONLY)
endif()

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/meshtestConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/meshtestConfig.cmake
  INSTALL_DESTINATION ${MESHTEST_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/meshtestConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/meshtestConfig.cmake
  ${PROJECT_BINARY_DIR}/meshtestConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/meshtest_testing.cmake
  ${PROJECT_SOURCE_DIR}/cmake/lsan.supp  # the MPI test environment of sanitizer builds
  DESTINATION ${MESHTEST_INSTALL_CMAKEDIR})

# The build tree as a package: meshtest_DIR=<build dir>.
export(EXPORT meshtestTargets
  NAMESPACE meshtest::
  FILE ${PROJECT_BINARY_DIR}/meshtestTargets.cmake)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/meshtestConfig.cmake.in
  ${PROJECT_BINARY_DIR}/meshtestConfig.cmake
  INSTALL_DESTINATION ${PROJECT_BINARY_DIR}
  INSTALL_PREFIX ${PROJECT_BINARY_DIR})
configure_file(${PROJECT_SOURCE_DIR}/cmake/meshtest_testing.cmake
               ${PROJECT_BINARY_DIR}/meshtest_testing.cmake COPYONLY)
configure_file(${PROJECT_SOURCE_DIR}/cmake/lsan.supp ${PROJECT_BINARY_DIR}/lsan.supp COPYONLY)
