// meshtest-bench ccl's output: the nccl-tests table, the α-β model's fit and projection, and
// the rows as JSON.
#include <fmt/format.h>

#include <span>
#include <string>
#include <vector>

#include "bench/alpha_beta.hpp"
#include "bench/ccl_bench.hpp"
#include "src/core/file.hpp"

namespace meshtest::bench::ccl {

std::string human(double bytes) {
  if (bytes >= 1 << 20) return fmt::format("{:g} MiB", bytes / (1 << 20));
  if (bytes >= 1 << 10) return fmt::format("{:g} KiB", bytes / (1 << 10));
  return fmt::format("{:g} B", bytes);
}

void print_header(const Options& o, CclOp op, int p) {
  fmt::print(
      "#\n# {} vs {} — np {}, dim {}, redop {}, {} warm-up, then {} x {} calls each in "
      "alternating windows of <= 2 ms; time = best window's average (max over ranks)\n"
      "# ratio = meshtest busbw / MPI busbw = MPI time / meshtest time (1.00 = as fast as MPI)\n"
      "# per call and device (the busiest), from the shared-memory path's own accounting: steps "
      "(agreement included), bytes written into the window and read from other devices' slots "
      "(or, with --memory arena, their inputs in place); "
      "min = the ring minimum each way, bus_factor(p)·S; touch = max(wr, rd) / min\n"
      "#{:>12} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}   {:>10} {:>8} {:>6}   {:>6} {:>11} {:>11} "
      "{:>11} {:>5}\n"
      "#{:>12} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}   {:>10} {:>8} {:>6}   {:>6} {:>11} {:>11} "
      "{:>11} {:>5}\n",
      dist::ccl_case(op).name, dist::ccl_case(op).mpi_name, p, o.dim, dist::reduce_op_name(o.redop),
      o.warmup, o.rounds, o.iters, "size", "count", "type", "time", "algbw", "busbw", "#wrong",
      "mpi time", "mpi bus", "ratio", "steps", "wr/dev", "rd/dev", "min", "touch", "(B)",
      "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "", "", "(B)", "(B)",
      "(B)", "");
}

void print_row(const Row& r, DType t) {
  fmt::print(" {:>12} {:>12} {:>6} {:>10.1f} {:>8.3f} {:>8.3f} {:>7}   {:>10.1f} {:>8.3f} {:>6.2f}",
             r.bytes, r.count, dtype_name(t), r.time_us, r.algbw, r.busbw,
             r.wrong < 0 ? std::string("N/A") : std::to_string(r.wrong), r.mpi_time_us, r.mpi_busbw,
             r.ratio);
  if (r.counted) {
    fmt::print("   {:>6.0f} {:>11.0f} {:>11.0f} {:>11.0f} {:>5.2f}\n", r.steps, r.written, r.read,
               r.ring_min, r.touched());
  } else {
    fmt::print("   {:>6} {:>11} {:>11} {:>11.0f} {:>5}\n", "-", "-", "-", r.ring_min, "-");
  }
}

void print_model(CclOp op, int p, const std::vector<Row>& rows) {
  const dist::CclCase& in = dist::ccl_case(op);
  std::vector<AlphaBetaSample> s;
  const bool counted = rows.front().counted;
  for (const Row& r : rows) {
    s.push_back({.steps = r.counted ? r.steps : in.ring_passes * (p - 1.0),
                 .bytes_term = in.bus_factor(p) * static_cast<double>(r.bytes),
                 .seconds = r.time_us * 1e-6});
  }
  if (p < 2 || s.size() < 2) {
    fmt::print("# α-β model of {}: needs np >= 2 and two sizes or more\n", in.name);
    return;
  }
  const AlphaBeta m = fit_alpha_beta(s);
  fmt::print(
      "# α-β model of {} ({}): t = α·{} + β·busfactor(p)·S, fitted on np {} "
      "(relative least squares over {} sizes, rms error {:.1f} %):\n"
      "#   α = {:.2f} us per step, 1/β = {:.3f} GB/s\n#   projected time (us):\n#{:>7}",
      in.name, counted ? "shared-memory path" : "ring",
      counted ? "steps (counted per size; they do not grow with p)"
              : (in.ring_passes == 1 ? "(p-1)" : "2(p-1)"),
      p, s.size(), 100 * m.rel_rms, m.alpha * 1e6, 1e-9 / m.beta, "ranks");
  std::vector<const Row*> picked{&rows.front()};
  if (rows.size() > 2) picked.push_back(&rows[rows.size() / 2]);
  if (rows.size() > 1) picked.push_back(&rows.back());
  for (const Row* r : picked) fmt::print(" {:>14}", human(static_cast<double>(r->bytes)));
  fmt::print("\n");
  for (int q = 16; q <= 1024; q *= 2) {
    fmt::print("#{:>7}", q);
    for (const Row* r : picked) {
      const double steps = r->counted ? r->steps : in.ring_passes * (q - 1.0);
      fmt::print(" {:>14.1f}",
                 1e6 * m.predict(steps, in.bus_factor(q) * static_cast<double>(r->bytes)));
    }
    fmt::print("\n");
  }
}

void print_memcpy(CclOp op, const std::vector<Row>& rows, const std::vector<double>& gbps) {
  fmt::print(
      "# {} busbw / memcpy bandwidth of the same bytes (every rank copying at once); the "
      "targets: all_reduce and reduce_scatter >= 0.8 from 4 MiB (--memory arena)\n"
      "#        size   memcpy   busbw  busbw/memcpy      wr/dev      rd/dev\n"
      "#         (B)   (GB/s)  (GB/s)                       (B)         (B)\n",
      dist::ccl_case(op).name);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    fmt::print("{:>13} {:>8.2f} {:>7.2f} {:>13.2f} {:>11} {:>11}\n", r.bytes, gbps[i], r.busbw,
               r.busbw / gbps[i], r.counted ? fmt::format("{:.0f}", r.written) : "-",
               r.counted ? fmt::format("{:.0f}", r.read) : "-");
  }
}

nlohmann::json to_json(const Row& r, const Options& o, int p) {
  return {{"op", dist::ccl_case(r.op).name},
          {"bytes", r.bytes},
          {"dtype", dtype_name(o.dtype)},
          {"np", p},
          {"dim", o.dim},
          {"memory", o.arena ? "arena" : "heap"},
          {"time_us", r.time_us},
          {"algbw", r.algbw},
          {"busbw", r.busbw},
          {"wrong", r.wrong},
          {"mpi_time_us", r.mpi_time_us},
          {"mpi_busbw", r.mpi_busbw},
          {"ratio", r.ratio},
          {"ring_min_bytes", r.ring_min},
          {"steps", r.counted ? nlohmann::json(r.steps) : nlohmann::json()},
          {"written_bytes", r.counted ? nlohmann::json(r.written) : nlohmann::json()},
          {"read_bytes", r.counted ? nlohmann::json(r.read) : nlohmann::json()}};
}

void write_json(const std::string& path, const nlohmann::json& rows) {
  const std::string text = rows.dump(2) + "\n";
  const std::span<const std::byte> part = std::as_bytes(std::span(text));
  write_file_atomic(path, std::span(&part, 1));
  fmt::print("# wrote {} rows to {}\n", rows.size(), path);
}

}  // namespace meshtest::bench::ccl
