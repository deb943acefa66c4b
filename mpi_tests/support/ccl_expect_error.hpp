// MPI test helper: a CCL's bad input throws the same meshtest::Error on every device of the
// group, and the mesh stays in step afterwards.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <string>

#include "dist/ccl/all_reduce.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::ccl_test {

/// Rank 0's s of comm on every rank.
inline std::string bcast_string(std::string s, MPI_Comm comm) {
  int n = static_cast<int>(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, comm);
  s.resize(static_cast<std::size_t>(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, comm);
  return s;
}

/// Runs f on every device; expects a meshtest::Error on every device whose message (after the
/// "[rank r] " prefix) is the same across the group and contains every needle. Then a plain
/// all_reduce over the whole mesh proves no device was left inside a collective.
inline void expect_error(const MeshDevice& mesh, int axis, const std::string& what,
                         const std::function<void()>& f,
                         std::initializer_list<std::string> needles) {
  SCOPED_TRACE(what);
  std::string msg;
  try {
    f();
  } catch (const Error& e) {
    msg = e.what();
  }
  int threw = msg.empty() ? 0 : 1, all = 0;
  MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(threw, 1) << "no meshtest::Error on this device";
  EXPECT_EQ(all, 1) << "some device did not throw";
  const std::string body = msg.substr(std::min(msg.size(), msg.find("] ") + 2));
  if (axis >= kAllAxes && axis <= 1) {
    EXPECT_EQ(body, bcast_string(body, mesh.comm(axis))) << "messages differ within the group";
  }
  for (const std::string& n : needles) {
    EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
  Tensor one(Shape{1}, DType::i32);
  one.fill(1);
  EXPECT_EQ(all_reduce(mesh, one).item(0), mesh.size()) << "the mesh is out of step";
}

}  // namespace meshtest::dist::ccl_test
