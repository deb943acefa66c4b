// tune_malloc_for_collectives: an opt-in glibc malloc setting for programs that run many
// large collectives.
#pragma once

namespace meshtest::dist {

/// Opt-in, process-wide: sets glibc's malloc so that freed large buffers stay in the heap
/// for reuse (mallopt M_MMAP_MAX = 0: large blocks come from the heap, not from mmap;
/// M_TRIM_THRESHOLD = 1 GiB: freed memory is not returned to the system). Every collective
/// allocates its output; without this glibc maps and unmaps each large output (and Open
/// MPI's internal buffers) on every call, so each call page-faults fresh memory, which at
/// 256 KiB - 2 MiB costs more than the data exchange itself. The trade-off: the process
/// keeps its peak heap (it does not shrink after large frees) and large allocations can
/// fragment the heap. The library never calls this; programs that want it call it once,
/// early (meshtest-bench ccl / profiler and meshtest-demo do). Not thread-safe with
/// concurrent allocation; call it before starting threads. Returns false (and changes
/// nothing) when MESHTEST_MALLOC_TUNING=0 is set in the environment, true otherwise.
bool tune_malloc_for_collectives();

}  // namespace meshtest::dist
