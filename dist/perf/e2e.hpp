// End-to-end timing of a function over the mesh: warm-up, then measured iterations.
#pragma once

#include <functional>

#include "dist/mesh/mesh_device.hpp"
#include "src/perf/measurements.hpp"

namespace meshtest::dist {

struct E2eOptions {
  int warmup = 10;
  int iterations = 100;
};

/// Collective over the whole mesh: runs `fn` opts.warmup + opts.iterations times; each
/// iteration starts after a barrier and its time is the slowest device's. Returns mean, min,
/// max and std (µs) of the measured iterations on every device. Throws the same Error on every
/// device when the options differ between devices or are out of range (warmup >= 0,
/// iterations >= 1).
perf::E2eStats time_e2e(const MeshDevice& mesh, const std::function<void()>& fn,
                        const E2eOptions& opts = {});

}  // namespace meshtest::dist
