// meshtest-bench ccl's geometry: the layout of one size, the sizes of the table, the case
// table's call at a layout, and where the ranks run.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bench/ccl_bench.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::bench::ccl {

Layout layout_of(CclOp op, std::int64_t bytes, const Options& o, int p) {
  const auto e = static_cast<std::int64_t>(dtype_size(o.dtype));
  const std::int64_t rows = o.dim == 0 ? 1 : o.rows;
  const std::int64_t unit = rows * (op == CclOp::all_reduce ? 1 : p);
  const std::int64_t n = std::max<std::int64_t>(1, bytes / e / unit) * unit;
  Layout l{.rows = rows, .cols = n / rows, .block = 0};
  l.block = op == CclOp::all_reduce ? l.cols : l.cols / p;
  return l;
}

std::vector<std::int64_t> sizes_of(const Options& o) {
  std::vector<std::int64_t> out;
  for (double b = static_cast<double>(o.min_bytes); b <= static_cast<double>(o.max_bytes) * 1.0001;
       b = o.factor > 1 ? b * o.factor : 2 * b + 1) {
    out.push_back(static_cast<std::int64_t>(b));
  }
  return out;
}

dist::CclCall call_of(const Layout& l, CclOp op, const Options& o, int p) {
  const Shape in = l.shape(op == CclOp::all_gather ? l.block : l.cols);
  std::vector<int> devices(static_cast<std::size_t>(p));
  std::iota(devices.begin(), devices.end(), 0);
  return {.op = op,
          .dtype = o.dtype,
          .reduce = o.redop,
          .devices = std::move(devices),
          .shape = in,
          .dim = in.rank() - 1,
          .concat_dim = in.rank() - 1};
}

std::string describe_nodes(MPI_Comm comm) {
  int p = 0, me = 0;
  MESHTEST_MPI(MPI_Comm_size(comm, &p));
  MESHTEST_MPI(MPI_Comm_rank(comm, &me));
  std::array<char, MPI_MAX_PROCESSOR_NAME> name{};
  int len = 0;
  MESHTEST_MPI(MPI_Get_processor_name(name.data(), &len));
  std::vector<char> all(static_cast<std::size_t>(p) * MPI_MAX_PROCESSOR_NAME);
  MESHTEST_MPI(MPI_Gather(name.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, comm));
  if (me != 0) return {};
  std::vector<std::pair<std::string, std::vector<int>>> hosts;  // in order of first rank
  for (int r = 0; r < p; ++r) {
    const std::string h(all.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& e) { return e.first == h; });
    if (it == hosts.end()) it = hosts.insert(hosts.end(), {h, {}});
    it->second.push_back(r);
  }
  if (hosts.size() == 1) return fmt::format("{} on 1 node ({})", p, hosts[0].first);
  std::string out = fmt::format("{} on {} nodes:", p, hosts.size());
  for (const auto& [h, ranks] : hosts) {
    out += fmt::format(" {} x{} (ranks {})", h, ranks.size(), fmt::join(ranks, " "));
  }
  return out;
}

}  // namespace meshtest::bench::ccl
