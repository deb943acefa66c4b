// gnuplot plots: a script and data files in a temp dir, gnuplot run with posix_spawn.
#include "src/perf/plot.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "src/core/error.hpp"
#include "src/core/json.hpp"

extern char** environ;

namespace meshtest::perf {

namespace {

namespace fs = std::filesystem;

/// A gnuplot single-quoted string (no escapes inside; a quote is doubled).
std::string gp_quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Writes the data files and the script into a fresh temp dir, runs gnuplot there and renames
/// its output over `png`. The script's data files are named by their bare names.
void render(const std::string& body, const std::vector<std::pair<std::string, std::string>>& data,
            const fs::path& png) {
  const fs::path gnuplot = require_gnuplot();
  static std::atomic<unsigned> counter{0};
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("meshtest-plot-{}-{}", ::getpid(), counter++);
  fs::create_directories(dir);
  const fs::path out_abs = fs::absolute(png);
  MESHTEST_CHECK(!out_abs.parent_path().empty() && fs::is_directory(out_abs.parent_path()),
                 "plot: output directory of '{}' does not exist", png.string());
  const fs::path tmp_png = fs::path(out_abs.string() + fmt::format(".tmp.{}.png", ::getpid()));
  for (const auto& [name, text] : data) std::ofstream(dir / name) << text;
  std::ofstream(dir / "plot.gp") << fmt::format(
      "set terminal pngcairo size 1200,650 noenhanced font 'DejaVu Sans,10'\n"
      "set output {}\ncd {}\n{}\n",
      gp_quote(tmp_png.string()), gp_quote(dir.string()), body);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string err_path = (dir / "stderr.txt").string();
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  std::string exe = gnuplot.string(), script = (dir / "plot.gp").string();
  char* argv[] = {exe.data(), script.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  if (rc == 0) waitpid(pid, &status, 0);
  const std::string err = read_text(err_path);
  std::error_code ec;
  const bool ok = rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && fs::exists(tmp_png) &&
                  fs::file_size(tmp_png, ec) > 0;
  if (!ok) {
    fs::remove(tmp_png, ec);
    fs::remove_all(dir, ec);
    fail("plot '{}': gnuplot ({}) failed (exit status {}): {}", png.string(), exe,
         rc == 0 ? WEXITSTATUS(status) : rc, err.empty() ? "no message" : err);
  }
  fs::rename(tmp_png, out_abs, ec);
  fs::remove_all(dir);
  MESHTEST_CHECK(!ec, "plot '{}': rename failed: {}", png.string(), ec.message());
}

double number_field(const nlohmann::json& j, const char* key, std::string_view where) {
  MESHTEST_CHECK(j.contains(key) && j[key].is_number(), "{}: field '{}' missing or not a number",
                 where, key);
  return j[key].get<double>();
}

// Integer fields are read as numbers (1024.0 is accepted) that must be whole and fit in Int.
template <class Int>
Int integer_field(const nlohmann::json& j, const char* key, std::string_view where) {
  const double v = number_field(j, key, where);
  const auto lo = static_cast<double>(std::numeric_limits<Int>::min());  // -2^(bits - 1)
  MESHTEST_CHECK(v == std::floor(v) && v >= lo && v < -lo,
                 "{}: field '{}' must be an integer in [{}, {}], got {}", where, key,
                 std::numeric_limits<Int>::min(), std::numeric_limits<Int>::max(), j[key].dump());
  return static_cast<Int>(v);
}

std::string string_field(const nlohmann::json& j, const char* key, std::string_view where) {
  MESHTEST_CHECK(j.contains(key) && j[key].is_string(), "{}: field '{}' missing or not a string",
                 where, key);
  return j[key].get<std::string>();
}

}  // namespace

fs::path find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');) {
    if (d.empty()) continue;
    const fs::path p = fs::path(d) / "gnuplot";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

fs::path require_gnuplot() {
  fs::path p = find_gnuplot();
  MESHTEST_CHECK(!p.empty(),
                 "gnuplot not found on PATH: plots are drawn by gnuplot; install the Debian "
                 "package gnuplot-nox (apt-get install gnuplot-nox)");
  return p;
}

void plot_op_durations(const Aggregate& a, const fs::path& png, std::string_view title) {
  MESHTEST_CHECK(!a.ops.empty(), "plot '{}': the aggregated report has no ops", png.string());
  std::string data = "# index label kernel_us op_to_op_us\n";
  for (const OpSummary& op : a.ops) {
    std::string label = fmt::format("{} {}", op.index, op.op_code);
    std::erase(label, '"');
    data += fmt::format("{} \"{}\" {} {}\n", op.index, label, op.kernel_duration_us,
                        op.op_to_op_latency_us);
  }
  const std::string body = fmt::format(
      "set title {}\n"
      "set style data histograms\nset style histogram clustered gap 1\n"
      "set style fill solid 0.85 border -1\nset boxwidth 0.9\n"
      "set ylabel 'us (average per iteration)'\nset yrange [0:*]\nset grid ytics\n"
      "set xtics rotate by -40 scale 0\nset key top left\nset bmargin 8\n"
      "plot 'ops.dat' using 3:xtic(2) title 'kernel duration', '' using 4 title 'op-to-op "
      "latency'",
      gp_quote(fmt::format("{} - {} devices, {} iterations; totals: kernel {:.1f} us, op-to-op "
                           "{:.1f} us",
                           title, a.devices, a.iterations, a.total_kernel_duration_us,
                           a.total_op_to_op_latency_us)));
  render(body, {{"ops.dat", data}}, png);
}

std::vector<CclBenchRow> parse_ccl_bench_json(std::string_view text, std::string_view source) {
  nlohmann::json rows = nlohmann::json::array();
  try {
    const nlohmann::json j = nlohmann::json::parse(text, json_depth_limit(std::string(source)));
    if (j.is_array())
      rows = j;
    else if (j.is_object() && j.contains("rows"))
      rows = j["rows"];
    else
      rows.push_back(j);
  } catch (const nlohmann::json::exception&) {  // parse_error, out_of_range (1e400)
    // JSON lines: one object per non-empty line.
    std::stringstream in{std::string(text)};
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        rows.push_back(nlohmann::json::parse(line, json_depth_limit(std::string(source))));
      } catch (const nlohmann::json::exception& e) {
        fail("{}: not JSON (neither a document nor JSON lines): line {}: {}", source, line_no,
             e.what());
      }
    }
  }
  MESHTEST_CHECK(rows.is_array() && !rows.empty(), "{}: no bench rows", source);
  std::vector<CclBenchRow> out;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const nlohmann::json& r = rows[k];
    const std::string where = fmt::format("{}: row {}", source, k);
    MESHTEST_CHECK(r.is_object(), "{}: expected an object, got {}", where, r.type_name());
    out.push_back({.op = string_field(r, "op", where),
                   .bytes = integer_field<std::int64_t>(r, "bytes", where),
                   .dtype = string_field(r, "dtype", where),
                   .np = integer_field<int>(r, "np", where),
                   .time_us = number_field(r, "time_us", where),
                   .algbw = number_field(r, "algbw", where),
                   .busbw = number_field(r, "busbw", where),
                   .wrong = integer_field<std::int64_t>(r, "wrong", where),
                   .mpi_time_us = number_field(r, "mpi_time_us", where),
                   .mpi_busbw = number_field(r, "mpi_busbw", where),
                   .ratio = number_field(r, "ratio", where),
                   .dim = r.contains("dim") ? integer_field<int>(r, "dim", where) : 0});
    MESHTEST_CHECK(out.back().bytes > 0, "{}: bytes must be > 0 for a log-scale plot, got {}",
                   where, out.back().bytes);
  }
  return out;
}

void plot_ccl_busbw(const std::vector<CclBenchRow>& rows, const fs::path& png,
                    std::string_view title) {
  MESHTEST_CHECK(!rows.empty(), "plot '{}': no bench rows", png.string());
  std::map<std::string, std::string> series;  // "op np=N dtype" -> data lines
  for (const CclBenchRow& r : rows) {
    const std::string dim = r.dim ? fmt::format(" dim={}", r.dim) : "";
    series[fmt::format("{}{} np={} {}", r.op, dim, r.np, r.dtype)] +=
        fmt::format("{} {} {}\n", r.bytes, r.busbw, r.mpi_busbw);
  }
  std::string data, plots;
  int index = 0, color = 1;
  for (const auto& [name, lines] : series) {
    data += lines + "\n\n";
    plots += fmt::format(
        "{}'ccl.dat' index {} using 1:2 with linespoints lw 2 pt 7 lc {} title {}, "
        "'ccl.dat' index {} using 1:3 with linespoints lw 1 dt 2 pt 6 lc {} title {}",
        index ? ", " : "", index, color, gp_quote(name + " meshtest"), index, color,
        gp_quote(name + " MPI"));
    ++index;
    ++color;
  }
  const std::string body = fmt::format(
      "set title {}\nset logscale x 2\nset format x '%.0b%BB'\n"
      "set xlabel 'message size (bytes)'\nset ylabel 'busbw (GB/s)'\nset yrange [0:*]\n"
      "set grid\nset key outside right top\nplot {}",
      gp_quote(title), plots);
  render(body, {{"ccl.dat", data}}, png);
}

}  // namespace meshtest::perf
