// The common work of every collective: checks, metadata agreement.
#include "dist/ccl/detail.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <map>

#include "dist/ccl/group_calls.hpp"
#include "dist/ccl/path_registry.hpp"
#include "dist/ccl/private_comm.hpp"

namespace meshtest::dist {

namespace detail {
namespace {

std::string axis_name(int axis) { return axis == kAllAxes ? "all" : std::to_string(axis); }

MPI_Comm checked_comm(std::string_view op, const MeshDevice& mesh, int axis) {
  MESHTEST_DIST_CHECK(axis == kAllAxes || axis == 0 || axis == 1,
                      "{}: axis {} out of range: valid axes are 0, 1 and kAllAxes (-1) (mesh {})",
                      op, axis, mesh.str());
  return mesh.comm(axis);
}

std::string show(const AgreedOption& o, std::int64_t v) {
  return o.show != nullptr ? o.show(v) : std::to_string(v);
}

}  // namespace

std::string show_reduce_op(std::int64_t op) {
  return std::string(reduce_op_name(static_cast<ReduceOp>(op)));
}

void AgreedOptions::add(const AgreedOption& o) {
  MESHTEST_CHECK(n_ < kMax, "a collective agrees on at most {} options; adding '{}' is one more",
                 kMax, o.name);
  v_[n_++] = o;
}

// The log fields: the op's own, then the axis.
std::array<LogField, 4> log_fields(std::initializer_list<LogField> detail, int axis) {
  std::array<LogField, 4> out{};
  std::size_t n = std::min<std::size_t>(detail.size(), 3);
  std::copy_n(detail.begin(), n, out.begin());
  out[n] = {.key = "axis", .value = axis, .text = axis == kAllAxes ? "all" : ""};
  return out;
}

Call::Call(std::string_view op, const MeshDevice& mesh, int axis, const CclArg& x,
           std::initializer_list<LogField> detail)
    : op_(op),
      mesh_(mesh),
      axis_(axis),
      x_(x),
      comm_(checked_comm(op, mesh, axis)),
      size_(mesh.axis_size(axis)),
      index_(mesh.axis_index(axis)),
      perf_(op, perf::OpType::ccl),
      log_(log_fields(detail, axis)),
      scope_(op, x.shape, x.dtype,
             std::span(log_.data(), std::min<std::size_t>(detail.size(), 3) + 1)) {
  if (perf_.active()) perf_.input(perf::TensorInfo{.shape = x.shape, .dtype = x.dtype});
  perf_.attr("axis", axis_name(axis));
  if (!x.error.empty()) record(x.error);
}

void Call::output(const CclArg& out) {
  out_ = out;
  if (perf_.active()) perf_.output(perf::TensorInfo{.shape = out.shape, .dtype = out.dtype});
}

void Call::check_traceable() const {
  if (x_.tensor == nullptr || out_.tensor == nullptr) {
    fail("a perf::Trace captures host tensors only, and this call's operand is in {} memory",
         kind_name(x_.where));
  }
}

Meta Call::meta() const {
  Meta m;
  m.rank = x_.rank();
  for (int i = 0; i < x_.rank(); ++i) m.dims[static_cast<std::size_t>(i)] = x_.shape[i];
  m.dtype = static_cast<std::int32_t>(x_.dtype);
  m.memory = static_cast<std::int32_t>(x_.where.kind);
  m.ordinal = x_.where.ordinal;
  return m;
}

int Call::dim(std::string_view name, int d) {
  const int r = x_.rank();
  if (d >= -r && d < r) return d < 0 ? d + r : d;
  record(fmt::format("{} {} out of range [{}, {}) for x {}", name, d, -r, r, describe(x_)));
  return 0;
}

void Call::record(std::string message) {
  if (!error_) error_ = std::move(message);
}

std::string Call::who(int index) const {
  return fmt::format("device {} (axis index {})", group_[static_cast<std::size_t>(index)].device,
                     index);
}

void Call::fail_message(const std::string& message) const {
  dist::fail("{} on axis {} of mesh {}: {}", op_, axis_name(axis_), mesh_.str(), message);
}

void Call::agree(std::initializer_list<AgreedOption> given, Agreement a) {
  AgreedOptions options;
  for (const AgreedOption& o : given) options.add(o);
  for (const Path* p : registered_paths()) p->agreed_options(op_, options);
  PathChoice choice = choose_path(a.path, x_.where);
  if (!choice.error.empty()) record(std::move(choice.error));
  chosen_ = choice.path;
  if (chosen_ != nullptr) options.add(path_option(*chosen_));
  // The signature every device must share (the free dim's size included: uneven pieces take
  // the full path, which learns every size).
  perf::Signature sig(op_);
  sig.add("axis", axis_).add("p", size_);
  // The kind of memory (not the ordinal: each device has its own GPU); host memory adds nothing.
  if (!x_.where.is_host()) sig.add("memory", static_cast<std::int64_t>(x_.where.kind));
  for (const AgreedOption& o : options.all()) sig.add(o.name, o.value);
  std::uint64_t recorded = 0;  // the flight recorder's: without the free dim's size
  if (a.tensors) {
    Shape s = x_.shape;
    if (a.free_dim >= 0 && a.free_dim < s.rank()) {
      s[a.free_dim] = 0;
      recorded = perf::Signature(sig).add("x", s, x_.dtype).hash();
    }
    sig.add("x", x_.shape, x_.dtype);
  }
  if (recorded == 0) recorded = sig.hash();
  GroupCalls& calls = group_calls(comm_);
  seq_ = ++calls.n;
  ccl_log_agreeing(recorded, seq_, &calls.members);
  // The call's count on this communicator goes into the hash: a device that skipped or added a
  // collective disagrees here even when the calls look alike.
  const bool same =
      size_ <= 1 ? !error_ : agree_step(sig.hash() ^ (seq_ * 0x9E3779B97F4A7C15ULL), a);
  uniform_ = same && a.tensors;
  if (uniform_) {
    group_.assign(static_cast<std::size_t>(size_), meta());
    for (int i = 0; i < size_; ++i) group_[static_cast<std::size_t>(i)].device = device_of(i);
    plan_key_ = std::move(sig.add("index", index_));
    return;
  }
  full_agree(options.all(), a);
  for (const Meta& m : group_) sig.add("device", m.shape(), m.dtype_value());
  plan_key_ = std::move(sig.add("index", index_));
}

bool Call::agree_step(std::uint64_t h, const Agreement& a) {
  for (Path* p : registered_paths()) {
    if (const std::optional<bool> same = p->agree_step(comm_, h, error_.has_value(), x_, a.out)) {
      return *same;
    }
  }
  std::array<std::int64_t, 3> v{static_cast<std::int64_t>(h), static_cast<std::int64_t>(~h),
                                error_ ? 1 : 0};
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, v.data(), 3, MPI_INT64_T, MPI_MAX, comm_));
  // max(h) == ~max(~h) == min(h): every hash is equal.
  const bool same = v[0] == ~v[1] && v[2] == 0 && v[0] == static_cast<std::int64_t>(h);
  // The group agrees, so every device is here: the paths' set-up that needs them all.
  if (same && a.tensors) {
    for (Path* p : registered_paths()) p->agreed(comm_);
  }
  return same;
}

int Call::device_of(int index) const {
  const auto [r, c] = mesh_.coord();
  if (axis_ == 0) return mesh_.device_at(index, c);
  if (axis_ == 1) return mesh_.device_at(r, index);
  return index;
}

void Call::full_agree(std::span<const AgreedOption> options, const Agreement& a) {
  Meta mine = meta();
  mine.device = mesh_.device_id();
  mine.error = error_ ? 1 : 0;
  op_.copy(mine.op.data(), std::min(op_.size(), mine.op.size() - 1));
  mine.seq = seq_;
  std::size_t k = 0;
  for (const AgreedOption& o : options) mine.options.at(k++) = o.value;
  group_.assign(static_cast<std::size_t>(size_), Meta{});
  MESHTEST_MPI(
      MPI_Allgather(&mine, sizeof(Meta), MPI_BYTE, group_.data(), sizeof(Meta), MPI_BYTE, comm_));
  check_same_collective();

  // 1. Errors a device found in its own input: everyone reports the first such device's.
  const auto bad = std::ranges::count_if(group_, [](const Meta& m) { return m.error != 0; });
  if (bad > 0) {
    constexpr std::size_t kLen = 400;
    std::array<char, kLen> msg{};
    if (error_) error_->copy(msg.data(), kLen - 1);
    std::vector<char> all(kLen * group_.size());
    MESHTEST_MPI(MPI_Allgather(msg.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm_));
    const auto first = std::ranges::find_if(group_, [](const Meta& m) { return m.error != 0; });
    const auto i = static_cast<std::size_t>(first - group_.begin());
    fail("{}: {}{}", who(static_cast<int>(i)), std::string_view(all.data() + i * kLen),
         bad > 1 ? fmt::format(" ({} of {} devices reported errors)", bad, size_) : "");
  }
  // 2. Options every device must pass alike.
  const Meta& m0 = group_.front();
  for (int i = 1; i < size_; ++i) {
    const Meta& m = group_[static_cast<std::size_t>(i)];
    k = 0;
    for (const AgreedOption& o : options) {
      if (m.options[k] != m0.options[k]) {
        fail(
            "devices disagree on {}: {} passes {} but {} passes {}; every device of the group "
            "must pass the same {}",
            o.name, who(0), show(o, m0.options[k]), who(i), show(o, m.options[k]), o.name);
      }
      ++k;
    }
  }
  // 3. The kind of memory (broadcast's too: every device's output lives in its operand's).
  for (int i = 1; i < size_; ++i) {
    const Meta& m = group_[static_cast<std::size_t>(i)];
    if (m.memory != m0.memory) {
      fail(
          "devices disagree on memory: {} passes a tensor in {} memory but {} passes one in {} "
          "memory; every device of the group must pass its tensors in the same kind of memory",
          who(0), to_string(m0.where()), who(i), to_string(m.where()));
    }
  }
  if (!a.tensors) return;
  // 4. Dtype, then shape outside the free dim.
  for (int i = 1; i < size_; ++i) {
    const Meta& m = group_[static_cast<std::size_t>(i)];
    if (m.dtype != m0.dtype) {
      fail(
          "mixed dtypes across the group: {} passes {} but {} passes {}; every device must pass "
          "the same dtype",
          who(0), m0.dtype_value(), who(i), m.dtype_value());
    }
    bool same = m.rank == m0.rank;
    for (int d = 0; same && d < m.rank; ++d) {
      same = d == a.free_dim || m.dims[static_cast<std::size_t>(d)] == m0.dims[d];
    }
    if (!same) {
      fail(
          "shapes disagree{}: {} passes {}{} but {} passes {}{}; every device must pass the same "
          "shape{}{}",
          a.free_dim >= 0 ? fmt::format(" outside dim {}", a.free_dim) : "", who(0),
          m0.dtype_value(), m0.shape(), who(i), m.dtype_value(), m.shape(),
          a.free_dim >= 0 ? fmt::format(" except along dim {}", a.free_dim) : "", a.note);
    }
  }
}

void Call::check_same_collective() const {
  // Devices by the collective they called: op and count on this communicator.
  std::map<std::pair<std::string, std::uint64_t>, std::vector<int>> by;
  for (int i = 0; i < size_; ++i) {
    const Meta& m = group_[static_cast<std::size_t>(i)];
    by[{std::string(m.op.data()), m.seq}].push_back(i);
  }
  if (by.size() == 1) return;
  // The largest set of devices (on a tie, the one with axis index 0) is taken as what the
  // group did; the first device outside it is named.
  auto major = by.begin();
  for (auto it = by.begin(); it != by.end(); ++it) {
    if (it->second.size() > major->second.size() ||
        (it->second.size() == major->second.size() && it->second.front() == 0)) {
      major = it;
    }
  }
  const auto other = std::ranges::find_if(by, [&](const auto& e) { return &e != &*major; });
  std::vector<int> devices;
  for (int i : major->second) devices.push_back(group_[static_cast<std::size_t>(i)].device);
  const auto dumped = flight_dump("desync", "");
  const auto& [op, seq] = other->first;
  const auto& [major_op, major_seq] = major->first;
  // Not Call::fail, which names this device's op: the message is the same on every device.
  dist::fail(
      "collective desync on axis {} of mesh {}: {} called {} as collective #{} of this group, "
      "but device{} {} called {} #{}; every device of the group must call the same collectives "
      "in the same order{}",
      axis_name(axis_), mesh_.str(), who(other->second.front()), op, seq,
      devices.size() > 1 ? "s" : "", fmt::join(devices, ", "), major_op, major_seq,
      dumped ? fmt::format(" (flight recorder: {})", dumped->parent_path().string()) : "");
}

int Call::count(std::int64_t n, std::string_view what) const {
  if (n > INT_MAX) {
    fail(
        "{} is {} elements, more than MPI's int count limit {}; split the tensor into smaller "
        "calls",
        what, n, INT_MAX);
  }
  return static_cast<int>(n);
}

std::pair<std::vector<int>, std::vector<int>> Call::counts(std::span<const std::int64_t> elems,
                                                           std::string_view what) const {
  std::vector<int> counts, displs;
  std::int64_t at = 0;
  for (std::int64_t e : elems) {
    counts.push_back(count(e, what));
    displs.push_back(count(at, what));
    at += e;
  }
  return {std::move(counts), std::move(displs)};
}

void Call::check_reduce_op(ReduceOp op, DType t) const {
  if (t == DType::u8) {
    fail(
        "reduce op {} is not supported for dtype u8 (u8 holds packed formats; no reduction is "
        "defined)",
        reduce_op_name(op));
  }
  if (op == ReduceOp::avg && !is_floating(t)) {
    fail("reduce op avg is not supported for dtype {} (avg is defined for f32, f64, bf16 and f16)",
         t);
  }
}

}  // namespace detail
}  // namespace meshtest::dist
