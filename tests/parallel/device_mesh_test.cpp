// DeviceMesh (troupe/parallel/device_mesh.hpp) on the world communicator: coordinates,
// each dimension's group of ranks, -1 for the rest, and meshes that cannot be (a wrong
// product, ranks that disagree) failing every rank alike.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "train_world.hpp"
#include "troupe/error.hpp"
#include "troupe/parallel/device_mesh.hpp"

namespace troupe::train::testing {
namespace {

// The world ranks of `comm`'s members, in its order.
std::vector<std::int64_t> members(collectives::Communicator& comm) {
  std::vector<std::int64_t> mine{world().rank()};
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(collectives::Buffer(mine), collectives::Buffer(all));
  return all;
}

TEST(DeviceMesh, OneDimensionIsTheWholeWorldInRankOrder) {
  parallel::DeviceMesh mesh(world(), {{"dp", world().size()}});
  EXPECT_EQ(mesh.size("dp"), world().size());
  EXPECT_EQ(mesh.coordinate("dp"), world().rank());
  std::vector<std::int64_t> want;
  for (int r = 0; r < world().size(); ++r) want.push_back(r);
  EXPECT_EQ(members(mesh.comm("dp")), want);
  EXPECT_EQ(mesh.describe(), "dp " + std::to_string(world().size()));
}

TEST(DeviceMesh, TheLastDimensionVariesFastestAndEachGroupDiffersInItsDimensionOnly) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  parallel::DeviceMesh mesh(world(), parallel::parse_mesh("dp=2,tp=2"));
  const int r = world().rank();
  EXPECT_EQ(mesh.coordinate("dp"), r / 2);
  EXPECT_EQ(mesh.coordinate("tp"), r % 2);
  // tp groups {0,1} and {2,3}; dp groups {0,2} and {1,3}, each in coordinate order.
  EXPECT_EQ(members(mesh.comm("tp")), (std::vector<std::int64_t>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(members(mesh.comm("dp")), (std::vector<std::int64_t>{r % 2, r % 2 + 2}));
  EXPECT_EQ(mesh.comm("tp").rank(), mesh.coordinate("tp"));
  EXPECT_EQ(mesh.rank_at({1, 0}), 2);
  EXPECT_EQ(mesh.describe(), "dp 2 x tp 2");
}

TEST(DeviceMesh, ThreeDimensionsAtEightRanksGroupLikeMegatrons) {
  if (world().size() != 8) GTEST_SKIP() << "needs 8 ranks (parallel_mesh_8ranks)";
  parallel::DeviceMesh mesh(world(), parallel::parse_mesh("pp=2,dp=2,tp=2"));
  const int r = world().rank();
  const int pp = r / 4, dp = (r / 2) % 2, tp = r % 2;
  EXPECT_EQ(mesh.coordinate("pp"), pp);
  EXPECT_EQ(mesh.coordinate("dp"), dp);
  EXPECT_EQ(mesh.coordinate("tp"), tp);
  EXPECT_EQ(members(mesh.comm("tp")), (std::vector<std::int64_t>{r - tp, r - tp + 1}));
  EXPECT_EQ(members(mesh.comm("dp")), (std::vector<std::int64_t>{r - 2 * dp, r - 2 * dp + 2}));
  EXPECT_EQ(members(mesh.comm("pp")), (std::vector<std::int64_t>{r - 4 * pp, r - 4 * pp + 4}));
  EXPECT_EQ(mesh.rank_at({pp, dp, tp}), r);
  // A reduction over one dimension leaves the others apart: the tp sum of world ranks.
  std::vector<float> value{static_cast<float>(r)};
  mesh.comm("tp").allreduce(collectives::Buffer(value));
  EXPECT_EQ(value[0], static_cast<float>(2 * (r - tp) + 1));
}

TEST(DeviceMesh, MinusOneTakesTheRestAndSizeOneDimensionsHaveOneRank) {
  parallel::DeviceMesh mesh(world(), parallel::parse_mesh("pp=1,dp=-1,tp=1"));
  EXPECT_EQ(mesh.size("dp"), world().size());
  EXPECT_EQ(mesh.comm("pp").size(), 1);
  EXPECT_EQ(mesh.comm("tp").size(), 1);
  EXPECT_EQ(mesh.coordinate("dp"), world().rank());
  EXPECT_FALSE(mesh.has("cp"));
  EXPECT_THROW(mesh.comm("cp"), InvalidArgument);
}

TEST(DeviceMesh, AProductOtherThanTheWorldFailsEveryRankBeforeAnySplit) {
  try {
    parallel::DeviceMesh mesh(world(), {{"dp", world().size() + 1}});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("but the world has " + std::to_string(world().size())), std::string::npos)
        << e.what();
  }
  // The world is still in step: a collective after the failure agrees.
  EXPECT_TRUE(same_on_every_rank(42));
}

TEST(DeviceMesh, RanksGivenDifferentMeshesAllFailNamingTheOddOne) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const bool odd = world().rank() == world().size() - 1;
  std::vector<parallel::MeshDim> dims = odd ? parallel::parse_mesh("dp=-1,tp=1") : parallel::parse_mesh("dp=-1");
  try {
    parallel::DeviceMesh mesh(world(), dims);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_on_every_rank(7));
}

TEST(DeviceMesh, ParseMeshTakesNameEqualsSizeAndQuotesWhatItCannotRead) {
  const auto dims = parallel::parse_mesh("pp=2,dp=-1,tp=4");
  ASSERT_EQ(dims.size(), 3u);
  EXPECT_EQ(dims[0].name, "pp");
  EXPECT_EQ(dims[1].size, -1);
  EXPECT_EQ(dims[2].size, 4);
  for (const char* bad : {"", "dp", "dp=", "=2", "dp=two", "dp=2,", "dp=2x"}) {
    try {
      parallel::parse_mesh(bad);
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("device mesh '" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
  // Valid syntax, impossible meshes: refused by the constructor, the same on every rank.
  for (const char* bad : {"dp=0", "dp=-1,tp=-1", "dp=1,dp=1", "d-p=1"}) {
    EXPECT_THROW(parallel::DeviceMesh(world(), parallel::parse_mesh(bad)), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace troupe::train::testing
