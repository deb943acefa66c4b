// reduce_scatter's point-to-point messages use a private communicator: a wildcard receive the
// user has pending on the same axis communicator neither takes them nor is completed by them.
// (On one node the shared-memory path sends no messages at all; ctest also runs this binary
// with MESHTEST_CCL_SHM=0 as test_ccl_private_comm_mpi_path, where the messages are sent.)
// And the per-communicator objects (CommAttribute) that hold it: a remembered lookup never
// outlives its communicator.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <span>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/private_comm.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

TEST(CclPrivateComm, PendingWildcardReceiveOnTheAxisCommIsNotMatched) {
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size();
  const int r = mesh.device_id();
  const MPI_Comm comm = mesh.comm(1);
  // A user receive from anyone with any tag, large enough for any block the CCL sends.
  std::vector<int> inbox(1024, -1);
  MPI_Request user = MPI_REQUEST_NULL;
  ASSERT_EQ(MPI_Irecv(inbox.data(), static_cast<int>(inbox.size()), MPI_INT, MPI_ANY_SOURCE,
                      MPI_ANY_TAG, comm, &user),
            MPI_SUCCESS);

  // x on device d: element k = 10 * d + k; sum over devices of element k = 10 p(p-1)/2 + p k.
  constexpr int kPer = 3;
  std::vector<float> v(static_cast<std::size_t>(kPer * p));
  for (std::size_t k = 0; k < v.size(); ++k)
    v[k] = static_cast<float>(10 * r + static_cast<int>(k));
  const Tensor x = Tensor::from_vector(Shape{kPer * p}, v);
  for (int round = 0; round < 2; ++round) {  // the second call runs from the cached plan
    const Tensor y = reduce_scatter(mesh, x, {.axis = 1});
    ASSERT_EQ(y.shape(), Shape{kPer});
    const std::span<const float> got = y.span<float>();
    for (int k = 0; k < kPer; ++k) {
      const int e = kPer * r + k;
      EXPECT_EQ(got[static_cast<std::size_t>(k)], static_cast<float>(5 * p * (p - 1) + p * e));
    }
  }
  int done = 1;
  MPI_Status early{};
  ASSERT_EQ(MPI_Test(&user, &done, &early), MPI_SUCCESS);
  ASSERT_EQ(done, 0) << "reduce_scatter's traffic matched the user's wildcard receive (source "
                     << early.MPI_SOURCE << ", tag " << early.MPI_TAG << ", first int " << inbox[0]
                     << ")";

  // Every device has checked before any user message goes out (a barrier's traffic is not
  // point-to-point: it cannot match the receive either).
  ASSERT_EQ(MPI_Barrier(comm), MPI_SUCCESS);
  // The user's own message (from the previous device, tag 7) is the one it receives.
  const int mine = 1000 + r;
  MPI_Request send = MPI_REQUEST_NULL;
  ASSERT_EQ(MPI_Isend(&mine, 1, MPI_INT, (r + 1) % p, 7, comm, &send), MPI_SUCCESS);
  MPI_Status st{};
  ASSERT_EQ(MPI_Wait(&user, &st), MPI_SUCCESS);
  ASSERT_EQ(MPI_Wait(&send, MPI_STATUS_IGNORE), MPI_SUCCESS);
  EXPECT_EQ(st.MPI_TAG, 7);
  EXPECT_EQ(st.MPI_SOURCE, (r - 1 + p) % p);
  int count = 0;
  MPI_Get_count(&st, MPI_INT, &count);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(inbox[0], 1000 + (r - 1 + p) % p);
}

TEST(CommAttribute, ALookupNeverOutlivesItsCommunicator) {
  struct Mark {
    int v = 0;
  };
  using Marks = detail::CommAttribute<Mark>;
  for (int round = 0; round < 4; ++round) {
    MPI_Comm a = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &a);
    EXPECT_EQ(Marks::find(a), nullptr) << "round " << round << ": a new communicator";
    Marks::attach(a, std::make_unique<Mark>(Mark{.v = 7 + round}));  // after a remembered miss
    ASSERT_NE(Marks::find(a), nullptr) << "round " << round;
    EXPECT_EQ(Marks::find(a)->v, 7 + round);
    const MPI_Comm freed = a;
    MPI_Comm_free(&a);
    MPI_Comm b = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &b);  // Open MPI may hand out the freed handle again
    EXPECT_EQ(Marks::find(b), nullptr)
        << "round " << round << (b == freed ? ": the freed handle, reused" : "");
    MPI_Comm_free(&b);
  }
}

}  // namespace
}  // namespace meshtest::dist
