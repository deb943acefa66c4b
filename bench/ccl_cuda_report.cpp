// meshtest-bench ccl --device cuda's output: the GPUs' line, the table (a column group per side),
// the targets' verdicts and the rows as JSON.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>
#include <nccl.h>

#include <array>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "bench/ccl_cuda.hpp"
#include "dist/gpu/ccl/nccl_calls.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::bench::ccl {
namespace {

/// A side's name in the targets' lines and its key in JSON.
constexpr std::array<std::string_view, kSides> kSideNames = {"the default path", "the NCCL path",
                                                             "NCCL"};
constexpr std::array<const char*, kSides> kSideKeys = {"exact", "nccl_path", "nccl"};

/// One side's cells: time, algbw, busbw, #wrong, and the ratio but for the direct call.
std::string cells(const GpuRow& r, Side s) {
  const Result& x = r.side[s];
  std::string out =
      fmt::format("  {:>9.1f} {:>8.2f} {:>8.2f} {:>6}", x.seconds * 1e6, r.algbw(s), r.busbw(s),
                  x.wrong < 0 ? std::string("N/A") : std::to_string(x.wrong));
  if (s != kDirect) out += fmt::format(" {:>5.2f}", r.ratio(s));
  return out;
}

/// The heads of one side's cells (two lines: names, units), as cells() lays them out.
std::array<std::string, 2> heads(Side s) {
  std::array<std::string, 2> h{
      fmt::format("  {:>9} {:>8} {:>8} {:>6}", "time", "algbw", "busbw", "#wrong"),
      fmt::format("  {:>9} {:>8} {:>8} {:>6}", "(us)", "(GB/s)", "(GB/s)", "")};
  if (s != kDirect) h[0] += fmt::format(" {:>5}", "ratio"), h[1] += fmt::format(" {:>5}", "");
  return h;
}

/// `s`'s busbw against the direct call's from `from` bytes: "holds (lowest ...)" or the misses.
void print_target(const std::vector<GpuRow>& rows, Side s, double least, std::int64_t from) {
  std::string misses;
  const GpuRow* lowest = nullptr;
  for (const GpuRow& r : rows) {
    if (r.bytes < from) continue;
    if (lowest == nullptr || r.ratio(s) < lowest->ratio(s)) lowest = &r;
    if (r.ratio(s) < least) {
      misses += fmt::format("{}{:.2f} at {}", misses.empty() ? "" : ", ", r.ratio(s),
                            human(static_cast<double>(r.bytes)));
    }
  }
  const std::string verdict = lowest == nullptr ? std::string("no size measured")
                              : misses.empty()
                                  ? fmt::format("holds (lowest {:.2f} at {})", lowest->ratio(s),
                                                human(static_cast<double>(lowest->bytes)))
                                  : "misses: " + misses;
  fmt::print("# target: {} at busbw >= {:.2f} x NCCL's from {}: {}\n", kSideNames[s], least,
             human(static_cast<double>(from)), verdict);
}

/// Below `below` bytes: the most time per call that `s` takes beyond the direct call.
void print_extra_time(const std::vector<GpuRow>& rows, Side s, std::int64_t below) {
  const GpuRow* worst = nullptr;
  const auto extra = [&](const GpuRow& r) { return r.side[s].seconds - r.side[kDirect].seconds; };
  for (const GpuRow& r : rows) {
    if (r.bytes < below && (worst == nullptr || extra(r) > extra(*worst))) worst = &r;
  }
  if (worst == nullptr) return;
  fmt::print("# below {}: {} takes at most {:+.1f} us per call beyond NCCL's (at {})\n",
             human(static_cast<double>(below)), kSideNames[s], extra(*worst) * 1e6,
             human(static_cast<double>(worst->bytes)));
}

}  // namespace

std::string describe_gpus(MPI_Comm comm, int gpu) {
  int p = 0, me = 0;
  MESHTEST_MPI(MPI_Comm_size(comm, &p));
  MESHTEST_MPI(MPI_Comm_rank(comm, &me));
  std::vector<int> gpus(static_cast<std::size_t>(p));
  MESHTEST_MPI(MPI_Gather(&gpu, 1, MPI_INT, gpus.data(), 1, MPI_INT, 0, comm));
  if (me != 0) return {};
  std::vector<std::string> ranks;
  for (int r = 0; r < p; ++r)
    ranks.push_back(fmt::format("rank {} cuda:{}", r, gpus[static_cast<std::size_t>(r)]));
  cudaDeviceProp prop{};
  MESHTEST_DIST_CUDA(cudaGetDeviceProperties(&prop, gpu));
  int nccl = 0, runtime = 0, driver = 0;
  {
    dist::gpu::NcclLock lock("ncclGetVersion");
    MESHTEST_NCCL(ncclGetVersion(&nccl), nullptr);
  }
  MESHTEST_DIST_CUDA(cudaRuntimeGetVersion(&runtime));
  MESHTEST_DIST_CUDA(cudaDriverGetVersion(&driver));
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  return fmt::format(
      "{} ({}); NCCL {}.{}.{}, CUDA runtime {}.{}, driver {}.{}; NCCL_NVLS_ENABLE={}",
      fmt::join(ranks, ", "), prop.name, nccl / 10000, nccl / 100 % 100, nccl % 100, runtime / 1000,
      runtime % 1000 / 10, driver / 1000, driver % 1000 / 10, nvls != nullptr ? nvls : "unset");
}

void print_gpu_header(const Options& o, CclOp op, std::string_view nccl, int p, bool order_free) {
  const bool reduces = op == CclOp::all_reduce || op == CclOp::reduce_scatter;
  fmt::print(
      "#\n# {} on GPUs vs {} — np {}{}; {} warm-up calls of each side, then {} rounds "
      "of a window of {} calls per side in turn; time = the best window's average between two "
      "CUDA events on the group's stream (max over ranks)\n"
      "# default: meshtest's exact path (the CPU path's bits){}; NCCL: {} itself on the same "
      "communicator, stream and buffers\n"
      "# ratio = busbw / NCCL's busbw = NCCL's time / time (1.00 = as fast as NCCL); #wrong = "
      "elements that differ bit for bit from the case table's output, summed over ranks{}\n",
      dist::ccl_case(op).name, nccl, p,
      reduces ? fmt::format(", redop {}", dist::reduce_op_name(o.redop)) : "", o.warmup, o.rounds,
      o.iters, reduces ? "; NCCL path: meshtest with NCCL's reductions" : "", nccl,
      !reduces || order_free
          ? ""
          : " (N/A: NCCL's order of additions may change the bits here: bf16 sums beyond 32 "
            "ranks, f16 sums beyond 256, avg at a p that is not a power of two)");
  std::string groups = fmt::format("#{:32}  {:^40}", "", "meshtest default (exact)");
  std::array<std::string, 2> lines{fmt::format("#{:>12} {:>12} {:>6}", "size", "count", "type"),
                                   fmt::format("#{:>12} {:>12} {:>6}", "(B)", "(elements)", "")};
  for (Side s : {kExact, kNcclPath, kDirect}) {
    if (s == kNcclPath && !reduces) continue;
    if (s == kNcclPath) groups += fmt::format("  {:^40}", "meshtest NCCL path");
    if (s == kDirect) groups += fmt::format("  {:^34}", nccl);
    const auto h = heads(s);
    lines[0] += h[0], lines[1] += h[1];
  }
  for (std::string* l : {&groups, &lines[0], &lines[1]}) {
    l->erase(l->find_last_not_of(' ') + 1);  // no trailing blanks
    fmt::print("{}\n", *l);
  }
}

void print_gpu_row(const GpuRow& r, DType t) {
  std::string line = fmt::format(" {:>12} {:>12} {:>6}", r.bytes, r.count, dtype_name(t));
  for (Side s : {kExact, kNcclPath, kDirect}) {
    if (r.side[s].run) line += cells(r, s);
  }
  fmt::print("{}\n", line);
}

void print_gpu_targets(const std::vector<GpuRow>& rows, bool reduces) {
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  const Side fast = reduces ? kNcclPath : kExact;  // the side that should match NCCL
  print_target(rows, fast, 0.95, kMiB);
  print_extra_time(rows, fast, kMiB);
  if (reduces) print_target(rows, kExact, 0.8, 64 * kMiB);
}

nlohmann::json to_json(const GpuRow& r, const Options& o, int p) {
  nlohmann::json j = {{"op", dist::ccl_case(r.op).name},
                      {"device", "cuda"},
                      {"bytes", r.bytes},
                      {"count", r.count},
                      {"dtype", dtype_name(o.dtype)},
                      {"redop", dist::reduce_op_name(o.redop)},
                      {"np", p}};
  for (Side s : {kExact, kNcclPath, kDirect}) {
    if (!r.side[s].run) {
      j[kSideKeys[s]] = nullptr;
      continue;
    }
    nlohmann::json x = {{"time_us", r.side[s].seconds * 1e6},
                        {"algbw", r.algbw(s)},
                        {"busbw", r.busbw(s)},
                        {"wrong", r.side[s].wrong}};
    if (s != kDirect) x["ratio"] = r.ratio(s);
    j[kSideKeys[s]] = x;
  }
  return j;
}

}  // namespace meshtest::bench::ccl
