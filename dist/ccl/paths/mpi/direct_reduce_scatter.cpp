// direct_reduce_scatter: block j of every device to device j (MPI_Isend / MPI_Irecv), then
// detail::reduce over the p blocks in axis order.
#include "dist/ccl/paths/mpi/direct_reduce_scatter.hpp"

#include "dist/ccl/reduce.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::detail {

DirectReduceScatter::DirectReduceScatter(std::vector<int> counts, DType t, int index)
    : counts_(std::move(counts)), t_(t), index_(index) {
  const std::size_t e = dtype_size(t);
  std::size_t at = 0;
  for (int c : counts_) {
    offsets_.push_back(at);
    at += static_cast<std::size_t>(c) * e;
  }
  const std::size_t p = counts_.size();
  const std::size_t mine = static_cast<std::size_t>(counts_[static_cast<std::size_t>(index)]) * e;
  received_bytes_ = mine * p;  // allocated at the first run: the shared-memory path never needs it
  requests_.resize(2 * (p - 1));
  terms_.resize(p);
}

void DirectReduceScatter::run(const std::byte* blocks, std::byte* out, MPI_Datatype mpi_t,
                              ReduceOp op, MPI_Comm comm) {
  const int p = static_cast<int>(counts_.size());
  const int r = index_;
  const int mine = counts_[static_cast<std::size_t>(r)];
  const std::size_t mine_bytes = static_cast<std::size_t>(mine) * dtype_size(t_);
  received_.resize(received_bytes_);
  auto* send = const_cast<std::byte*>(blocks);  // read only: MPI's send buffers are void*
  MPI_Request* req = requests_.data();
  for (int k = 1; k < p; ++k) {  // a shifted order, so no device is every device's first
    const int from = (r + k) % p, to = (r - k + p) % p;
    MESHTEST_MPI(MPI_Irecv(received_.data() + static_cast<std::size_t>(from) * mine_bytes, mine,
                           mpi_t, from, 0, comm, req++));
    MESHTEST_MPI(MPI_Isend(send + offsets_[static_cast<std::size_t>(to)],
                           counts_[static_cast<std::size_t>(to)], mpi_t, to, 0, comm, req++));
  }
  if (p > 1) MESHTEST_MPI(MPI_Waitall(2 * (p - 1), requests_.data(), MPI_STATUSES_IGNORE));
  for (int j = 0; j < p; ++j) {
    terms_[static_cast<std::size_t>(j)] =
        j == r ? blocks + offsets_[static_cast<std::size_t>(r)]
               : received_.data() + static_cast<std::size_t>(j) * mine_bytes;
  }
  reduce(out, terms_, mine, t_, op);
}

}  // namespace meshtest::dist::detail
