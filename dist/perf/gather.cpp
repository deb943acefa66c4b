// Gathers every device's op records to one device.
#include "dist/perf/gather.hpp"

#include <climits>
#include <cstdint>

#include "dist/mesh/mpi_check.hpp"
#include "src/perf/record_codec.hpp"

namespace meshtest::dist {

std::vector<perf::OpRecord> gather_records(const MeshDevice& mesh,
                                           std::span<const perf::OpRecord> mine, int root) {
  MPI_Comm comm = mesh.comm();
  const int n = mesh.size();
  // root is a plain argument: agree on it before using it, so a bad value fails everywhere.
  int roots[2] = {root, -root};
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, roots, 2, MPI_INT, MPI_MAX, comm));
  MESHTEST_DIST_CHECK(roots[0] == -roots[1] && root >= 0 && root < n,
                      "gather_records: root must be the same device id in [0, {}) on every "
                      "device, got {} here",
                      n, root);
  const std::vector<std::uint8_t> bytes = perf::encode_records(mine);
  const std::int64_t my_size = static_cast<std::int64_t>(bytes.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(n));
  MESHTEST_MPI(MPI_Allgather(&my_size, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm));
  std::int64_t total = 0;
  for (std::int64_t s : sizes) total += s;
  MESHTEST_DIST_CHECK(total <= INT_MAX,
                      "gather_records: {} bytes of encoded records exceed one MPI_Gatherv "
                      "(at most {} bytes); profile fewer iterations",
                      total, INT_MAX);
  std::vector<int> counts(sizes.begin(), sizes.end()), displs(static_cast<std::size_t>(n), 0);
  for (int d = 1; d < n; ++d) displs[d] = displs[d - 1] + counts[d - 1];
  const bool is_root = mesh.device_id() == root;
  std::vector<std::uint8_t> all(is_root ? static_cast<std::size_t>(total) : 0);
  MESHTEST_MPI(MPI_Gatherv(bytes.data(), static_cast<int>(my_size), MPI_BYTE, all.data(),
                           counts.data(), displs.data(), MPI_BYTE, root, comm));
  if (!is_root) return {};
  std::vector<perf::OpRecord> out;
  for (int d = 0; d < n; ++d) {
    const auto part = std::span(all).subspan(static_cast<std::size_t>(displs[d]),
                                             static_cast<std::size_t>(counts[d]));
    for (perf::OpRecord& r : perf::decode_records(part)) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace meshtest::dist
