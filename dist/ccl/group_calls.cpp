// GroupCalls and the registry behind ccl_group_counts.
#include "dist/ccl/group_calls.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>

#include "dist/ccl/ccl_log.hpp"
#include "dist/ccl/private_comm.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {

namespace detail {

namespace {

struct LiveGroups {
  std::mutex mutex;
  std::set<const GroupCalls*> all;
  /// Communicators freed since ccl_forget_freed_groups: their ranks and the most calls.
  std::map<std::vector<int>, std::uint64_t> freed;
};

LiveGroups& live_groups() {
  static LiveGroups* g = new LiveGroups;  // never destroyed: comms may be freed at exit
  return *g;
}

std::vector<int> world_ranks(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MESHTEST_MPI(MPI_Comm_group(comm, &group));
  MESHTEST_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
  int n = 0;
  MESHTEST_MPI(MPI_Group_size(group, &n));
  std::vector<int> mine(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  std::iota(mine.begin(), mine.end(), 0);
  MESHTEST_MPI(MPI_Group_translate_ranks(group, n, mine.data(), world, out.data()));
  MESHTEST_MPI(MPI_Group_free(&group));
  MESHTEST_MPI(MPI_Group_free(&world));
  return out;
}

}  // namespace

GroupCalls::GroupCalls(MPI_Comm comm) : members(world_ranks(comm)) {
  LiveGroups& g = live_groups();
  std::lock_guard lock(g.mutex);
  g.all.insert(this);
}

GroupCalls::~GroupCalls() {
  LiveGroups& g = live_groups();
  std::lock_guard lock(g.mutex);
  g.all.erase(this);
  if (n > 0) {
    std::uint64_t& most = g.freed[members];
    most = std::max<std::uint64_t>(most, n);
  }
}

GroupCalls& group_calls(MPI_Comm comm) {
  GroupCalls* c = CommAttribute<GroupCalls>::find(comm);
  if (c == nullptr) c = CommAttribute<GroupCalls>::attach(comm, std::make_unique<GroupCalls>(comm));
  return *c;
}

}  // namespace detail

std::vector<GroupCount> ccl_group_counts() {
  detail::LiveGroups& g = detail::live_groups();
  std::lock_guard lock(g.mutex);
  std::vector<GroupCount> out;
  for (const detail::GroupCalls* c : g.all) {
    if (c->n > 0) out.push_back({.members = c->members, .calls = c->n});
  }
  for (const auto& [members, calls] : g.freed) out.push_back({.members = members, .calls = calls});
  return out;
}

void ccl_forget_freed_groups() {
  detail::LiveGroups& g = detail::live_groups();
  std::lock_guard lock(g.mutex);
  g.freed.clear();
}

}  // namespace meshtest::dist
