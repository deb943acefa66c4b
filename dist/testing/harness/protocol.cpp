// Encoding of the control messages (length-prefixed fields) and polling send/receive.
#include "dist/testing/harness/protocol.hpp"

#include <cstring>
#include <thread>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::testing::detail {

namespace {

class Writer {
 public:
  Writer& i64(std::int64_t v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(std::string_view s) {
    i64(static_cast<std::int64_t>(s.size()));
    out_.append(s);
    return *this;
  }
  Writer& parts(const std::vector<TestPart>& ps) {
    i64(static_cast<std::int64_t>(ps.size()));
    for (const TestPart& p : ps) {
      i64(p.rank).i64(p.skip).str(p.file).i64(p.line).str(p.message).str(p.also);
    }
    return *this;
  }
  Writer& ints(const std::vector<int>& v) {
    i64(static_cast<std::int64_t>(v.size()));
    for (int x : v) i64(x);
    return *this;
  }
  Writer& groups(const std::vector<GroupCount>& gs) {
    i64(static_cast<std::int64_t>(gs.size()));
    for (const GroupCount& g : gs) ints(g.members).i64(static_cast<std::int64_t>(g.calls));
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  std::int64_t i64() {
    std::int64_t v = 0;
    need(sizeof v);
    std::memcpy(&v, in_.data(), sizeof v);
    in_.remove_prefix(sizeof v);
    return v;
  }
  int i32() { return static_cast<int>(i64()); }
  std::string str() {
    const std::int64_t n = i64();
    MESHTEST_CHECK(n >= 0, "harness control message: negative string length {}", n);
    need(static_cast<std::size_t>(n));
    std::string s(in_.substr(0, static_cast<std::size_t>(n)));
    in_.remove_prefix(static_cast<std::size_t>(n));
    return s;
  }
  std::vector<TestPart> parts() {
    std::vector<TestPart> ps(static_cast<std::size_t>(count()));
    for (TestPart& p : ps) {
      p.rank = i32();
      p.skip = i64() != 0;
      p.file = str();
      p.line = i32();
      p.message = str();
      p.also = str();
    }
    return ps;
  }
  std::vector<int> ints() {
    std::vector<int> v(static_cast<std::size_t>(count()));
    for (int& x : v) x = i32();
    return v;
  }
  std::vector<GroupCount> groups() {
    std::vector<GroupCount> gs(static_cast<std::size_t>(count()));
    for (GroupCount& g : gs) {
      g.members = ints();
      g.calls = static_cast<std::uint64_t>(i64());
    }
    return gs;
  }
  std::int64_t count() {
    const std::int64_t n = i64();
    MESHTEST_CHECK(n >= 0 && static_cast<std::size_t>(n) <= in_.size(),
                   "harness control message: bad element count {}", n);
    return n;
  }

 private:
  void need(std::size_t n) const {
    MESHTEST_CHECK(in_.size() >= n, "harness control message truncated: {} bytes needed, {} left",
                   n, in_.size());
  }
  std::string_view in_;
};

}  // namespace

std::string encode(const Arrival& a) {
  return Writer()
      .i64(a.finish)
      .i64(a.index)
      .str(a.name)
      .i64(static_cast<int>(a.status))
      .i64(a.exit_code)
      .parts(a.parts)
      .str(a.flight)
      .groups(a.groups)
      .take();
}

Arrival decode_arrival(std::string_view bytes) {
  Reader r(bytes);
  Arrival a;
  a.finish = r.i64() != 0;
  a.index = r.i64();
  a.name = r.str();
  a.status = static_cast<Status>(r.i32());
  a.exit_code = r.i32();
  a.parts = r.parts();
  a.flight = r.str();
  a.groups = r.groups();
  return a;
}

std::string encode(const Verdict& v) {
  Writer w;
  w.i64(static_cast<int>(v.status)).str(v.summary).parts(v.parts).i64(v.exit_code).str(v.flight);
  w.i64(static_cast<std::int64_t>(v.skipped.size()));
  for (int r : v.skipped) {
    w.i64(r);
  }
  return w.take();
}

Verdict decode_verdict(std::string_view bytes) {
  Reader r(bytes);
  Verdict v;
  v.status = static_cast<Status>(r.i32());
  v.summary = r.str();
  v.parts = r.parts();
  v.exit_code = r.i32();
  v.flight = r.str();
  v.skipped.resize(static_cast<std::size_t>(r.count()));
  for (int& s : v.skipped) {
    s = r.i32();
  }
  return v;
}

std::string encode(const Snapshot& s) {
  return Writer()
      .i64(s.rank)
      .i64(static_cast<std::int64_t>(s.query))
      .str(s.activity)
      .str(s.last.op)
      .i64(static_cast<std::int64_t>(s.last.seq))
      .str(s.last.detail)
      .i64(s.last.completed)
      .i64(static_cast<std::int64_t>(s.last.group_seq))
      .ints(s.last.members)
      .parts(s.parts)
      .str(s.flight)
      .take();
}

Snapshot decode_snapshot(std::string_view bytes) {
  Reader r(bytes);
  Snapshot s;
  s.rank = r.i32();
  s.query = static_cast<std::uint64_t>(r.i64());
  s.activity = r.str();
  s.last.op = r.str();
  s.last.seq = static_cast<std::uint64_t>(r.i64());
  s.last.detail = r.str();
  s.last.completed = r.i64() != 0;
  s.last.group_seq = static_cast<std::uint64_t>(r.i64());
  s.last.members = r.ints();
  s.parts = r.parts();
  s.flight = r.str();
  return s;
}

std::string encode_query(std::uint64_t id, std::string_view dump) {
  return Writer().i64(static_cast<std::int64_t>(id)).str(dump).take();
}

std::pair<std::uint64_t, std::string> decode_query(std::string_view bytes) {
  Reader r(bytes);
  const auto id = static_cast<std::uint64_t>(r.i64());
  return {id, r.str()};
}

std::string encode(const Exited& e) { return Writer().i64(e.code).str(e.activity).take(); }

Exited decode_exited(std::string_view bytes) {
  Reader r(bytes);
  Exited e;
  e.code = r.i32();
  e.activity = r.str();
  return e;
}

void Backoff::pause() {
  if (n_ < 20) {
    ++n_;
    std::this_thread::yield();
    return;
  }
  // 100 us steps growing by 100 us per 10 pauses, up to max_ms.
  const int us = std::min(max_ms_ * 1000, 100 * (1 + (n_++ - 20) / 10));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

std::optional<Message> try_receive(MPI_Comm comm, int source, int tag) {
  int flag = 0;
  MPI_Status st;
  MESHTEST_MPI(MPI_Iprobe(source, tag, comm, &flag, &st));
  if (flag == 0) {
    return std::nullopt;
  }
  int count = 0;
  MESHTEST_MPI(MPI_Get_count(&st, MPI_CHAR, &count));
  Message m{.source = st.MPI_SOURCE, .tag = st.MPI_TAG, .bytes = std::string(count, '\0')};
  // Only this thread receives (source, tag) on comm, so the probed message is the one received.
  MESHTEST_MPI(MPI_Recv(m.bytes.data(), count, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, comm,
                        MPI_STATUS_IGNORE));
  return m;
}

Message receive(MPI_Comm comm, int source, int tag) {
  Backoff backoff;
  for (;;) {
    if (auto m = try_receive(comm, source, tag)) {
      return std::move(*m);
    }
    backoff.pause();
  }
}

void send(MPI_Comm comm, int dest, int tag, const std::string& bytes) {
  MPI_Request req = MPI_REQUEST_NULL;
  MESHTEST_MPI(
      MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_CHAR, dest, tag, comm, &req));
  Backoff backoff;
  for (int done = 0;;) {
    MESHTEST_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done != 0) {
      return;
    }
    backoff.pause();
  }
}

}  // namespace meshtest::dist::testing::detail
