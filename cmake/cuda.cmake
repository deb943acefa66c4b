# cuda.cmake — the MESHTEST_CUDA option (AUTO, ON, OFF) and what the GPU side needs: the CUDA
# toolkit (nvcc, CUDA::cudart, CUDA::cublas, CUDA::cublasLt) and NCCL (meshtest::nccl,
# cmake/FindNCCL.cmake).
# AUTO builds the GPU side when all are found and says what is missing otherwise; ON makes a
# missing one a configure error; OFF looks for nothing. Sets MESHTEST_CUDA_ENABLED (ON or OFF)
# for the rest of the tree and, when ON, enables the CUDA language (architectures 90:
# sm_90 code and compute_90 PTX, unless CMAKE_CUDA_ARCHITECTURES or CUDAARCHS says otherwise).
# Included from the top-level directory: enable_language must run there.
if(PROJECT_IS_TOP_LEVEL)
  set(meshtest_cuda_default AUTO)
else()
  set(meshtest_cuda_default OFF)  # a parent project asks for the GPU side itself
endif()
set(MESHTEST_CUDA ${meshtest_cuda_default} CACHE STRING
    "Build the GPU side (src/gpu, dist/gpu): AUTO when the CUDA toolkit and NCCL are found, ON, OFF")
set_property(CACHE MESHTEST_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${MESHTEST_CUDA}" meshtest_cuda_mode)
if(NOT meshtest_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MESHTEST_CUDA is '${MESHTEST_CUDA}': it must be AUTO, ON or OFF")
endif()

set(MESHTEST_CUDA_ENABLED OFF)
if(MESHTEST_FUZZ)  # libFuzzer's instrumentation is for clang-compiled host code only
  if(meshtest_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "MESHTEST_CUDA=ON and MESHTEST_FUZZ=ON: the fuzz build is CPU only")
  endif()
  set(meshtest_cuda_mode OFF)
endif()
if(NOT meshtest_cuda_mode STREQUAL "OFF")
  set(meshtest_cuda_missing)
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND meshtest_cuda_missing "the CUDA toolkit (nvcc and libcudart: set CUDAToolkit_ROOT)")
  else()
    if(NOT CUDAToolkit_NVCC_EXECUTABLE)
      list(APPEND meshtest_cuda_missing "nvcc (CUDA toolkit ${CUDAToolkit_VERSION})")
    endif()
    foreach(lib cudart cublas cublasLt)
      if(NOT TARGET CUDA::${lib})
        list(APPEND meshtest_cuda_missing "CUDA::${lib} (lib${lib} of CUDA ${CUDAToolkit_VERSION})")
      endif()
    endforeach()
  endif()
  find_package(NCCL QUIET)
  if(NOT NCCL_FOUND)
    list(APPEND meshtest_cuda_missing
         "NCCL (nccl.h and libnccl, looked for in NCCL_ROOT, the usual places and the toolkit's)")
  endif()
  if(meshtest_cuda_missing)
    list(JOIN meshtest_cuda_missing "; " meshtest_cuda_missing)
    if(meshtest_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "MESHTEST_CUDA=ON, but the GPU side's dependencies are missing: "
                          "${meshtest_cuda_missing}")
    endif()
    message(STATUS "GPU side: off (MESHTEST_CUDA=AUTO; missing: ${meshtest_cuda_missing}); "
                   "building for CPU ranks only")
  else()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
      set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING
          "GPU architectures of the CUDA code (90: H100 and H200, sm_90 code and compute_90 PTX)")
    endif()
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
    if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
      set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)  # one libcudart in a process: CUDA::cudart's
    endif()
    enable_language(CUDA)
    set(MESHTEST_CUDA_ENABLED ON)
    message(STATUS "GPU side: on (CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR}, "
                   "NCCL ${NCCL_VERSION}: ${NCCL_LIBRARY}; architectures "
                   "${CMAKE_CUDA_ARCHITECTURES})")
  endif()
  unset(meshtest_cuda_missing)
endif()
unset(meshtest_cuda_mode)
unset(meshtest_cuda_default)
