# meshtest_add_mpi_test(<target> [NAME name] [NP n...] [SCALE] [SCALE_NP n...] [SCALE_ONLY]
#                       [TIMEOUT s] [SCALE_TIMEOUT s] [ENV var=value...] [ARGS ...])
# Registers an MPI GoogleTest binary in CTest once per rank count, as
# <name>.np<N> (name defaults to the target), with labels "mpi" and "np<N>",
# PROCESSORS N up to MESHTEST_TEST_PROCESSORS (see meshtest_test_processors), COST N (ctest
# starts the larger jobs first), a timeout (default 300 s) and ENV added to the environment.
# NP defaults to MESHTEST_DEFAULT_NPS (1 2 3 4 8), or to none with SCALE_ONLY (only the
# scale runs).
# Scale runs: SCALE adds the rank counts of MESHTEST_SCALE_NPS (6 12 16) and
# SCALE_NP the given ones (e.g. 32); they are labelled "scale" as well (`ctest -L
# scale` runs only them, `-LE scale` leaves them out), time out after
# SCALE_TIMEOUT (default: TIMEOUT), and none is registered when
# MESHTEST_SCALE_TESTS is OFF. A count already in NP is not registered twice.
# mpirun gets --oversubscribe (the rank count may exceed the cores) and is
# allowed to run as root (CI containers).
include_guard(GLOBAL)

set(MESHTEST_DEFAULT_NPS 1 2 3 4 8 CACHE STRING "Rank counts for MPI tests")
# Open MPI's tuned collectives switch algorithms with the communicator size: the
# CCL, placement and parallel tests also run at these counts (and test_ccl and
# test_expert_parallel at 32), oversubscribed on a small machine.
set(MESHTEST_SCALE_NPS 6 12 16 CACHE STRING
    "Rank counts of the scale runs of MPI tests registered with SCALE (label scale)")
option(MESHTEST_SCALE_TESTS "Register the scale runs (SCALE, SCALE_NP) of MPI tests" ON)

# Environment of every MPI test run. Sanitizer builds suppress the MPI
# runtime's own process-lifetime allocations (cmake/lsan.supp), not ours.
# The tests' jobs run on one machine (or on its simulated hosts, over TCP): Open MPI's ob1 over
# shared memory and TCP, without probing the fabric components (UCX, OFI, openib), which costs
# 0.2-0.3 s of every job's start where there is no fabric (np 8: 0.63 -> 0.34 s). Empty: Open
# MPI's own choice.
set(MESHTEST_TEST_MPI_MCA "OMPI_MCA_pml=ob1;OMPI_MCA_btl=^openib,ofi;OMPI_MCA_osc=^ucx"
    CACHE STRING "Open MPI MCA variables of the tests' jobs (empty: Open MPI's own choice)")
# Every process of a job loads hwloc (Open MPI's topology) and with it hwloc's plugins: the PCI
# one reads each device's configuration space, the XML one libxml2, the GL one libX11. A job's
# processes need none of them (the topology of cores and caches is hwloc's core): without them a
# job starts in 15 % less CPU time (np 16: 1.10 -> 0.98 CPU-s, mpirun included).
set(MESHTEST_MPI_TEST_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
    "HWLOC_PLUGINS_BLACKLIST=hwloc_pci,hwloc_xml_libxml,hwloc_gl,hwloc_opencl"
    ${MESHTEST_TEST_MPI_MCA})
if(MESHTEST_SANITIZE)
  list(APPEND MESHTEST_MPI_TEST_ENV
       "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/lsan.supp:print_suppressions=0"
       # Full stacks for malloc and no dlclose of MPI components, so that the
       # suppressions can match Open MPI's frames.
       "ASAN_OPTIONS=fast_unwind_on_malloc=0"
       "OMPI_MCA_mca_base_component_disable_dlclose=1")
endif()

# ctest's slots. `meshtest test` runs ctest -j 2N on N cores, so that jobs that mostly wait
# (process start, fault deadlines, child jobs) leave their cores to others. A job holds one slot
# per rank up to MESHTEST_TEST_PROCESSORS, 2N - 1 by default: the jobs of 2N ranks and more then
# run one at a time (two oversubscribed jobs side by side thrash the scheduler), with one slot
# left beside them for a single-slot job (a unit test, a fault launcher that waits).
cmake_host_system_information(RESULT meshtest_cores QUERY NUMBER_OF_LOGICAL_CORES)
math(EXPR meshtest_processors_cap "2 * ${meshtest_cores} - 1")
if(meshtest_processors_cap LESS 1)
  set(meshtest_processors_cap 1)
endif()
set(MESHTEST_TEST_PROCESSORS ${meshtest_processors_cap} CACHE STRING
    "The most ctest slots (PROCESSORS) one test holds (default: 2 x cores - 1)")

# meshtest_test_processors(<out> <n>): the PROCESSORS of a job of n ranks (or build jobs).
function(meshtest_test_processors out n)
  if(n GREATER MESHTEST_TEST_PROCESSORS)
    set(n ${MESHTEST_TEST_PROCESSORS})
  endif()
  set(${out} ${n} PARENT_SCOPE)
endfunction()

function(meshtest_add_mpi_test target)
  cmake_parse_arguments(ARG "SCALE;SCALE_ONLY" "TIMEOUT;SCALE_TIMEOUT;NAME" "NP;SCALE_NP;ARGS;ENV"
                        ${ARGN})
  if(NOT ARG_NAME)
    set(ARG_NAME ${target})
  endif()
  if(NOT ARG_NP AND NOT ARG_SCALE_ONLY)
    set(ARG_NP ${MESHTEST_DEFAULT_NPS})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_SCALE_TIMEOUT)
    set(ARG_SCALE_TIMEOUT ${ARG_TIMEOUT})
  endif()
  set(scale_nps)
  if(MESHTEST_SCALE_TESTS)
    if(ARG_SCALE)
      list(APPEND scale_nps ${MESHTEST_SCALE_NPS})
    endif()
    list(APPEND scale_nps ${ARG_SCALE_NP})
    list(REMOVE_DUPLICATES scale_nps)
    if(ARG_NP)
      list(REMOVE_ITEM scale_nps ${ARG_NP})
    endif()
  endif()
  foreach(np IN LISTS ARG_NP scale_nps)
    if(np IN_LIST scale_nps)
      set(labels "mpi;scale;np${np}")
      set(timeout ${ARG_SCALE_TIMEOUT})
    else()
      set(labels "mpi;np${np}")
      set(timeout ${ARG_TIMEOUT})
    endif()
    add_test(NAME ${ARG_NAME}.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
    meshtest_test_processors(processors ${np})
    set_tests_properties(${ARG_NAME}.np${np} PROPERTIES
      LABELS "${labels}"
      PROCESSORS ${processors}
      COST ${np}
      TIMEOUT ${timeout}
      ENVIRONMENT "${MESHTEST_MPI_TEST_ENV};${ARG_ENV}")
  endforeach()
endfunction()
