# meshtest_add_mpi_test(<target> [NAME name] [NP n...] [TIMEOUT s] [ENV var=value...]
#                       [ARGS ...])
# Registers an MPI GoogleTest binary in CTest once per rank count, as
# <name>.np<N> (name defaults to the target), with labels "mpi" and "np<N>",
# PROCESSORS N, a timeout and ENV added to the environment.
# mpirun gets --oversubscribe (the rank count may exceed the cores) and is
# allowed to run as root (CI containers).
include_guard(GLOBAL)

set(MESHTEST_DEFAULT_NPS 1 2 3 4 8 CACHE STRING "Rank counts for MPI tests")

# Environment of every MPI test run. Sanitizer builds suppress the MPI
# runtime's own process-lifetime allocations (cmake/lsan.supp), not ours.
set(MESHTEST_MPI_TEST_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
if(MESHTEST_SANITIZE)
  list(APPEND MESHTEST_MPI_TEST_ENV
       "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/lsan.supp:print_suppressions=0"
       # Full stacks for malloc and no dlclose of MPI components, so that the
       # suppressions can match Open MPI's frames.
       "ASAN_OPTIONS=fast_unwind_on_malloc=0"
       "OMPI_MCA_mca_base_component_disable_dlclose=1")
endif()

function(meshtest_add_mpi_test target)
  cmake_parse_arguments(ARG "" "TIMEOUT;NAME" "NP;ARGS;ENV" ${ARGN})
  if(NOT ARG_NAME)
    set(ARG_NAME ${target})
  endif()
  if(NOT ARG_NP)
    set(ARG_NP ${MESHTEST_DEFAULT_NPS})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  foreach(np IN LISTS ARG_NP)
    add_test(NAME ${ARG_NAME}.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
    set_tests_properties(${ARG_NAME}.np${np} PROPERTIES
      LABELS "mpi;np${np}"
      PROCESSORS ${np}
      TIMEOUT ${ARG_TIMEOUT}
      ENVIRONMENT "${MESHTEST_MPI_TEST_ENV};${ARG_ENV}")
  endforeach()
endfunction()
