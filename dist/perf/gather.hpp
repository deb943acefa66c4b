// Gathers every device's op records to one device (MPI_Gatherv of encoded records).
#pragma once

#include <span>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "src/perf/op_record.hpp"

namespace meshtest::dist {

/// Collective over the whole mesh: every device passes its own records (e.g. perf::records());
/// device `root` gets all devices' records, grouped by device in mesh order (each device's in
/// call order); the other devices get an empty vector. Every device checks the same sizes, so
/// a too-large gather throws the same Error on every device (never a hang).
std::vector<perf::OpRecord> gather_records(const MeshDevice& mesh,
                                           std::span<const perf::OpRecord> mine, int root = 0);

}  // namespace meshtest::dist
