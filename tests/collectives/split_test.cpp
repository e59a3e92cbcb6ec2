// Sub-communicators made by split(color, key).
#include <memory>

#include "test_world.hpp"

namespace troupe::collectives::testing {
namespace {

TEST(Split, ByParityGroupsRanksAndOrdersThemByKey) {
  Communicator& comm = world();
  const int rank = comm.rank(), size = comm.size();
  const int color = rank % 2;
  // Reverse order inside each group: the highest old rank becomes rank 0.
  std::unique_ptr<Communicator> half = comm.split(color, -rank);
  ASSERT_NE(half, nullptr);
  int members = 0, below = 0;
  for (int r = 0; r < size; ++r) {
    if (r % 2 != color) continue;
    ++members;
    if (r > rank) ++below;
  }
  EXPECT_EQ(half->size(), members);
  EXPECT_EQ(half->rank(), below);
  // A collective on the half sums only its members' ranks.
  std::vector<std::int64_t> value{rank};
  half->allreduce(Buffer(value));
  std::int64_t want = 0;
  for (int r = color; r < size; r += 2) want += r;
  EXPECT_EQ(value[0], want);
}

TEST(Split, InterleavesWithTheParentsCollectives) {
  Communicator& comm = world();
  std::unique_ptr<Communicator> all = comm.split(0, comm.rank());
  ASSERT_NE(all, nullptr);
  std::vector<float> a(2000, 1.0f), b(2000, 2.0f);
  Work on_child = all->allreduce_async(Buffer(a));
  comm.allreduce(Buffer(b));
  on_child.wait();
  EXPECT_EQ(a[1999], static_cast<float>(comm.size()));
  EXPECT_EQ(b[0], 2.0f * comm.size());
}

TEST(Split, WithANegativeColorReturnsNoCommunicator) {
  Communicator& comm = world();
  const bool out = comm.rank() == comm.size() - 1 && comm.size() > 1;
  std::unique_ptr<Communicator> rest = comm.split(out ? -1 : 0, 0);
  EXPECT_EQ(rest == nullptr, out);
  if (rest) {
    EXPECT_EQ(rest->size(), comm.size() > 1 ? comm.size() - 1 : 1);
    rest->barrier();
  }
}

}  // namespace
}  // namespace troupe::collectives::testing
