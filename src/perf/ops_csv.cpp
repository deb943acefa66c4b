// The ops_perf CSV: writer, RFC 4180 cell quoting, and a validating reader.
#include "src/perf/ops_csv.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "src/core/error.hpp"
#include "src/core/file.hpp"
#include "src/perf/aggregate.hpp"

namespace meshtest::perf {

namespace {

constexpr std::array<std::string_view, 6> kTensorSuffixes = {"W", "Z",        "Y",
                                                             "X", "DATATYPE", "MEMORY"};
constexpr std::array<std::string_view, 2> kKinds = {"INPUT", "OUTPUT"};

std::string column(std::string_view kind, std::size_t i, std::string_view suffix) {
  return fmt::format("{}_{}_{}", kind, i, suffix);
}

std::string quote(std::string_view cell) {
  if (cell.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(cell);
  std::string out = "\"";
  for (char c : cell) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

std::vector<std::string> tensor_cells(const std::vector<TensorInfo>& ts, std::size_t count) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < count; ++i) {
    if (i >= ts.size()) {
      out.insert(out.end(), kTensorSuffixes.size(), "");
      continue;
    }
    for (std::int64_t d : wzyx(ts[i].shape)) out.push_back(std::to_string(d));
    out.emplace_back(dtype_name(ts[i].dtype));
    out.push_back(ts[i].memory);
  }
  return out;
}

/// Splits CSV text into rows of cells (RFC 4180 quoting), with each row's first line.
std::vector<std::pair<std::size_t, std::vector<std::string>>> split_csv(std::string_view text,
                                                                        const std::string& src) {
  std::vector<std::pair<std::size_t, std::vector<std::string>>> rows;
  std::vector<std::string> cells;
  std::string cell;
  std::size_t line = 1, row_line = 1;
  bool quoted = false, any = false;
  const auto end_row = [&] {
    cells.push_back(std::move(cell));
    cell.clear();
    if (!(cells.size() == 1 && cells[0].empty())) rows.emplace_back(row_line, std::move(cells));
    cells.clear();
    any = false;
  };
  for (std::size_t k = 0; k < text.size(); ++k) {
    const char c = text[k];
    if (!any) row_line = line, any = true;
    if (quoted) {
      if (c == '"' && k + 1 < text.size() && text[k + 1] == '"') {
        cell += '"';
        ++k;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.push_back(std::move(cell));
      cell.clear();
    } else if (c == '\n') {
      end_row();
      ++line;
    } else if (c != '\r') {
      cell += c;
    }
  }
  MESHTEST_CHECK(!quoted, "{}: line {}: unterminated quoted cell", src, row_line);
  if (any) end_row();
  return rows;
}

template <class T>
T number(const std::string& cell, const std::string& src, std::size_t line, std::string_view col) {
  T v{};
  const auto [p, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  MESHTEST_CHECK(ec == std::errc() && p == cell.data() + cell.size() && !cell.empty(),
                 "{}: line {}: column '{}': expected an integer, got '{}'", src, line, col, cell);
  return v;
}

}  // namespace

std::array<std::int64_t, 4> wzyx(const Shape& s) {
  std::array<std::int64_t, 4> out{1, 1, 1, 1};
  const int r = s.rank();
  for (int k = 0; k < std::min(r, 4); ++k) out[static_cast<std::size_t>(3 - k)] = s[r - 1 - k];
  for (int k = 0; k < r - 4; ++k) out[0] *= s[k];
  return out;
}

std::vector<std::pair<std::string, std::string>> tensor_fields(const OpRecord& r) {
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string_view kind : kKinds) {
    const auto& ts = kind == "INPUT" ? r.inputs : r.outputs;
    const std::vector<std::string> cells = tensor_cells(ts, ts.size());
    for (std::size_t k = 0; k < cells.size(); ++k) {
      out.emplace_back(
          column(kind, k / kTensorSuffixes.size(), kTensorSuffixes[k % kTensorSuffixes.size()]),
          cells[k]);
    }
  }
  return out;
}

std::string ops_csv(std::span<const OpRecord> records) {
  std::vector<const OpRecord*> order;
  for (const OpRecord& r : records) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), [](const OpRecord* a, const OpRecord* b) {
    return a->device_id < b->device_id;
  });
  std::size_t n_in = 0, n_out = 0;
  for (const OpRecord& r : records) {
    n_in = std::max(n_in, r.inputs.size());
    n_out = std::max(n_out, r.outputs.size());
  }
  std::vector<std::string> header(kOpsCsvColumns.begin(), kOpsCsvColumns.end());
  for (std::string_view kind : kKinds) {
    for (std::size_t i = 0; i < (kind == "INPUT" ? n_in : n_out); ++i) {
      for (std::string_view s : kTensorSuffixes) header.push_back(column(kind, i, s));
    }
  }
  std::string out;
  const auto emit = [&out](const std::vector<std::string>& cells) {
    for (std::size_t k = 0; k < cells.size(); ++k) {
      if (k) out += ',';
      out += quote(cells[k]);
    }
    out += '\n';
  };
  emit(header);
  // Timings need each device's records in call order: compute them over the sorted view.
  std::vector<OpRecord> sorted;
  sorted.reserve(order.size());
  for (const OpRecord* r : order) sorted.push_back(*r);
  const std::vector<OpTiming> timing = op_timings(sorted);
  for (std::size_t k = 0; k < sorted.size(); ++k) {
    const OpRecord& r = sorted[k];
    std::vector<std::string> cells = {r.op_code,
                                      std::string(op_type_name(r.op_type)),
                                      std::to_string(r.global_call_count),
                                      std::to_string(r.device_id),
                                      r.attributes,
                                      std::to_string(timing[k].kernel_ns),
                                      std::to_string(timing[k].op_to_op_ns)};
    for (const auto& c : tensor_cells(r.inputs, n_in)) cells.push_back(c);
    for (const auto& c : tensor_cells(r.outputs, n_out)) cells.push_back(c);
    emit(cells);
  }
  return out;
}

OpsReport parse_ops_csv(std::string_view text, std::string source) {
  const auto rows = split_csv(text, source);
  MESHTEST_CHECK(!rows.empty(), "{}: empty report: no header and no rows", source);
  const std::vector<std::string>& header = rows[0].second;
  std::map<std::string, std::size_t> col;
  for (std::size_t k = 0; k < header.size(); ++k) col[header[k]] = k;
  for (std::string_view name : kOpsCsvColumns) {
    MESHTEST_CHECK(col.count(std::string(name)),
                   "{}: missing column '{}' (an ops_perf CSV needs the columns {})", source, name,
                   fmt::join(kOpsCsvColumns, ", "));
  }
  // Tensor column groups: INPUT_<i>_* and OUTPUT_<i>_* must be complete for i = 0, 1, ...
  std::array<std::size_t, 2> groups{0, 0};
  for (std::size_t g = 0; g < kKinds.size(); ++g) {
    while (col.count(column(kKinds[g], groups[g], "W"))) ++groups[g];
    for (std::size_t i = 0; i < groups[g]; ++i) {
      for (std::string_view s : kTensorSuffixes) {
        MESHTEST_CHECK(col.count(column(kKinds[g], i, s)),
                       "{}: missing column '{}' ({}_{}_W is present, so its group needs W, Z, Y, "
                       "X, DATATYPE and MEMORY)",
                       source, column(kKinds[g], i, s), kKinds[g], i);
      }
    }
  }
  OpsReport rep{.source = source, .records = {}, .lines = {}};
  std::map<int, std::int64_t> clock;  // per device: end of its previous op
  for (std::size_t k = 1; k < rows.size(); ++k) {
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    const std::size_t line = rows[k].first;
    const std::vector<std::string>& cells = rows[k].second;
    MESHTEST_CHECK(cells.size() == header.size(), "{}: line {}: {} cells, the header has {}",
                   source, line, cells.size(), header.size());
    const auto cell = [&](std::string_view name) -> const std::string& {
      return cells[col.at(std::string(name))];
    };
    OpRecord r;
    r.op_code = cell("OP CODE");
    MESHTEST_CHECK(!r.op_code.empty(), "{}: line {}: empty OP CODE", source, line);
    try {
      r.op_type = op_type_from_name(cell("OP TYPE"));
    } catch (const Error& e) {
      fail("{}: line {}: {}", source, line, e.what());
    }
    r.global_call_count =
        number<std::int64_t>(cell("GLOBAL CALL COUNT"), source, line, "GLOBAL CALL COUNT");
    r.device_id = number<int>(cell("DEVICE ID"), source, line, "DEVICE ID");
    r.attributes = cell("ATTRIBUTES");
    const auto kernel =
        number<std::int64_t>(cell(kOpsCsvColumns[5]), source, line, kOpsCsvColumns[5]);
    const auto latency =
        number<std::int64_t>(cell(kOpsCsvColumns[6]), source, line, kOpsCsvColumns[6]);
    for (std::size_t g = 0; g < kKinds.size(); ++g) {
      for (std::size_t i = 0; i < groups[g]; ++i) {
        std::array<const std::string*, 6> v{};
        int present = 0;
        for (std::size_t s = 0; s < v.size(); ++s) {
          v[s] = &cells[col.at(column(kKinds[g], i, kTensorSuffixes[s]))];
          present += v[s]->empty() ? 0 : 1;
        }
        if (present == 0) continue;
        MESHTEST_CHECK(present == 6,
                       "{}: line {}: {}_{} is partly empty (W, Z, Y, X, DATATYPE "
                       "and MEMORY must all be set or all empty)",
                       source, line, kKinds[g], i);
        std::vector<std::int64_t> dims;
        for (std::size_t s = 0; s < 4; ++s) {
          dims.push_back(
              number<std::int64_t>(*v[s], source, line, column(kKinds[g], i, kTensorSuffixes[s])));
        }
        TensorInfo t{.shape = {}, .dtype = DType::f32, .memory = *v[5]};
        try {
          t.shape = Shape(dims);
          t.dtype = dtype_from_name(*v[4]);
        } catch (const Error& e) {
          fail("{}: line {}: {}_{}: {}", source, line, kKinds[g], i, e.what());
        }
        (g == 0 ? r.inputs : r.outputs).push_back(std::move(t));
      }
    }
    // Start and end times are sums of the durations and latencies before them: they must fit.
    std::int64_t& prev_end = clock[r.device_id];
    MESHTEST_CHECK(!__builtin_add_overflow(prev_end, latency, &r.start_ns) &&
                       !__builtin_add_overflow(
                           r.start_ns, r.op_type == OpType::signpost ? 0 : kernel, &r.end_ns),
                   "{}: line {}: device {}'s durations and latencies up to this row sum past the "
                   "int64 range of nanoseconds",
                   source, line, r.device_id);
    if (r.op_type != OpType::signpost) prev_end = r.end_ns;
    rep.records.push_back(std::move(r));
    rep.lines.push_back(line);
  }
  MESHTEST_CHECK(!rep.records.empty(), "{}: empty report: a header but no rows", source);
  try {
    measured_region(rep.records);
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  return rep;
}

OpsReport read_ops_csv(const std::filesystem::path& path) {
  return parse_ops_csv(read_text_file(path), path.string());
}

}  // namespace meshtest::perf
