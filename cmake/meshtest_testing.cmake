# meshtest_add_mpi_test(<target> [NAME name] [NP n...] [SCALE] [SCALE_NP n...] [SCALE_ONLY]
#                       [GPU] [TIMEOUT s] [SCALE_TIMEOUT s] [ENV var=value...] [ARGS ...])
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
# GPU: a test of GPU ranks (linked with meshtest::gpu_gtest_main): NP defaults to every count
# from 1 to MESHTEST_GPU_TEST_RANKS, the label "gpu" is added, and the jobs hold the lock
# meshtest_gpus (one at a time: each binds its ranks to GPUs 0..N-1).
# A job whose tests all skipped (no GPU for some rank, fewer ranks than a test needs) ends with
# the harness's line "[meshtest] every test of <name>.np<N> skipped: <why>" (the name from the
# variable MESHTEST_CTEST_NAME, which the harness takes out of the environment, so that a child
# job a test starts does not print it), which CTest reports as Skipped.
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
# GPU tests run at every rank count up to the GPUs of the machine that configures (nvidia-smi),
# and at least up to 4, so that a machine without GPUs registers (and skips) them too.
if(NOT DEFINED CACHE{MESHTEST_GPU_TEST_RANKS})
  set(meshtest_gpus 0)
  find_program(MESHTEST_NVIDIA_SMI nvidia-smi)
  mark_as_advanced(MESHTEST_NVIDIA_SMI)
  if(MESHTEST_NVIDIA_SMI)
    execute_process(COMMAND ${MESHTEST_NVIDIA_SMI} -L OUTPUT_VARIABLE meshtest_smi
                    RESULT_VARIABLE meshtest_smi_rc ERROR_QUIET TIMEOUT 20)
    if(meshtest_smi_rc EQUAL 0)
      string(REGEX MATCHALL "GPU [0-9]+:" meshtest_smi_gpus "${meshtest_smi}")
      list(LENGTH meshtest_smi_gpus meshtest_gpus)
    endif()
  endif()
  if(meshtest_gpus LESS 4)
    set(meshtest_gpus 4)
  endif()
  set(MESHTEST_GPU_TEST_RANKS ${meshtest_gpus} CACHE STRING
      "GPU tests (meshtest_add_mpi_test GPU) run at np 1..this (default: the GPUs here, >= 4)")
endif()

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
  cmake_parse_arguments(ARG "SCALE;SCALE_ONLY;GPU" "TIMEOUT;SCALE_TIMEOUT;NAME"
                        "NP;SCALE_NP;ARGS;ENV" ${ARGN})
  if(NOT ARG_NAME)
    set(ARG_NAME ${target})
  endif()
  if(NOT ARG_NP AND ARG_GPU)
    foreach(np RANGE 1 ${MESHTEST_GPU_TEST_RANKS})
      list(APPEND ARG_NP ${np})
    endforeach()
  elseif(NOT ARG_NP AND NOT ARG_SCALE_ONLY)
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
    if(ARG_GPU)
      list(APPEND labels gpu)
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
      SKIP_REGULAR_EXPRESSION "\\[meshtest\\] every test of ${ARG_NAME}.np${np} skipped"
      ENVIRONMENT "${MESHTEST_MPI_TEST_ENV};MESHTEST_CTEST_NAME=${ARG_NAME}.np${np};${ARG_ENV}")
    if(ARG_GPU)
      set_tests_properties(${ARG_NAME}.np${np} PROPERTIES RESOURCE_LOCK meshtest_gpus)
    endif()
  endforeach()
endfunction()
