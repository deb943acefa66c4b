// agree_or_throw: a local input check whose failure on any device makes every device throw.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <string_view>

namespace meshtest::dist {

/// Collective over `comm` (every rank calls it): a non-empty `local_error_message` on any rank
/// makes every rank throw the same meshtest::Error (after its own "[rank r] " prefix):
/// "device <f> of <n> rejected its input: <message of f>", f the lowest failing rank of comm
/// (a device's index in its group), n the size of comm.
/// Returns on all ranks when every message is empty. One MPI_Allreduce; on failure also two
/// MPI_Bcast. Call it before a rank's first collective on the bad input: nobody is left waiting.
void agree_or_throw(MPI_Comm comm, std::string_view local_error_message);

/// Collective over `comm`: runs `check` (which throws meshtest::Error on bad input), then
/// agree_or_throw with its message, prefixed "<what>: " when `what` is not empty.
void check_and_agree(MPI_Comm comm, std::string_view what, const std::function<void()>& check);

/// Local: runs `check`; the message of the meshtest::Error it throws, prefixed "<what>: " when
/// `what` is not empty, or "" when it returns. For an op that queues its local work before the
/// devices agree (so that the device computes while the hosts agree) and then calls
/// agree_or_throw with it.
std::string check_message(std::string_view what, const std::function<void()>& check);

/// Collective: the AND of `v` over the ranks of `comm`.
bool all_ranks(MPI_Comm comm, bool v);

}  // namespace meshtest::dist
