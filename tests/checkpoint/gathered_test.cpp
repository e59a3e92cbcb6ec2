// The gathered save: every rank sends its shards of each tensor to one CheckpointActor,
// which writes them into one full-state-dict file; and loads into other world sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gathered_world.hpp"
#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/checkpoint_actor.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Shape;
using tensor::Tensor;
using testing::barrier;
using testing::runtime;

using Case = testing::TensorCase;
// Sizes below, at and above the world size, a 0-dim tensor (one rank holds it), an
// empty one, and one of 256 KB.
const Case kCases[] = {{"/model/a.weight", DType::f32, {7}},
                       {"/model/b.weight", DType::bf16, {3, 5}},
                       {"/model/steps", DType::i64, {2}},
                       {"/model/scale", DType::f64, {}},
                       {"/model/empty", DType::f32, {0}},
                       {"/model/big", DType::f32, {64, 1024}},
                       {"/optimizer/a.weight/exp_avg", DType::f16, {7}}};

// The same full tensors on every rank (seeded by index).
Tensor full_tensor(std::size_t i) {
  return testing::random_tensor(kCases[i].shape, kCases[i].dtype, 100 + static_cast<std::uint32_t>(i));
}

SaveManifest manifest(std::int64_t step) {
  SaveManifest m;
  m.step = step;
  m.epoch = 2;
  m.world_size = runtime().size();
  m.run_id = "gathered";
  for (const Case& c : kCases) m.add_tensor(c.name, c.dtype, c.shape);
  m.attributes.push_back({"/sampler", "index", AttrValue(std::int64_t{640})});
  return m;
}

// Steps 1-2 of the protocol for this rank; `skip` leaves out this rank's piece of tensor 0.
void send_my_pieces(const actors::ActorRef<CheckpointActor>& actor, std::int64_t step, bool skip = false) {
  actor.ask(&CheckpointActor::begin, manifest(step)).get();
  std::vector<actors::Future<void>> sent;
  std::vector<Tensor> keep;                            // the pieces must outlive their futures
  for (std::size_t i = std::size(kCases); i-- > 0;) {  // reverse order: order does not matter
    if (skip && i == 0) continue;
    Tensor flat = full_tensor(i).reshape({-1});
    auto [b, e] = shard_range(flat.numel(), runtime().rank(), runtime().size());
    if (b == e) continue;
    keep.push_back(flat.slice(b, e));
    sent.push_back(send_piece(actor, step, static_cast<std::int64_t>(i), b, keep.back(), runtime().rank()));
  }
  for (auto& f : sent) f.get();
}

TEST(GatheredSave, AssemblesEveryRanksShardsIntoFullTensorsInOneFile) {
  testing::SharedDir dir;
  auto actor = testing::spawn_checkpoint_actor(dir.path(), "ckpt-assemble");
  send_my_pieces(actor, 7);
  barrier();
  if (runtime().rank() == 0) {
    EXPECT_EQ(fs::path(actor.ask(&CheckpointActor::commit, std::int64_t{7}).get()).filename(), "ckpt-000000007.h5");
  }
  barrier();

  FileReader file((dir.path() / "ckpt-000000007.h5").string());
  EXPECT_NO_THROW(file.verify_all());
  std::vector<TensorInfo> listed = file.tensors("/");
  ASSERT_EQ(listed.size(), std::size(kCases));
  for (std::size_t i = 0; i < std::size(kCases); ++i) {
    EXPECT_EQ(listed[i].path, kCases[i].name);
    EXPECT_TRUE(testing::same_bits(file.read(kCases[i].name), full_tensor(i))) << kCases[i].name;
  }
  Attributes root = file.attributes("/");
  EXPECT_EQ(root.get_int("world_size"), runtime().size());
  EXPECT_EQ(root.get_int("step"), 7);
  EXPECT_EQ(file.attributes("/sampler").get_int("index"), 640);
}

// Ranks [0, world) of another job each read their shard: here the ranks present play
// them in turn (rank r plays q when q % size == r).
void expect_reslices(const FileReader& file, int world) {
  for (int q = runtime().rank(); q < world; q += runtime().size()) {
    for (std::size_t i = 0; i < std::size(kCases); ++i) {
      Tensor flat = full_tensor(i).reshape({-1});
      auto [b, e] = shard_range(flat.numel(), q, world);
      Tensor got = file.read_range(kCases[i].name, b, e);
      EXPECT_TRUE(testing::same_bits(got, flat.slice(b, e).clone()))
          << kCases[i].name << " rank " << q << " of " << world;
    }
  }
}

TEST(GatheredSave, LoadsIntoOtherWorldSizesByReslicingFullTensors) {
  testing::SharedDir dir;
  auto actor = testing::spawn_checkpoint_actor(dir.path(), "ckpt-reslice");
  send_my_pieces(actor, 3);
  barrier();
  if (runtime().rank() == 0) actor.ask(&CheckpointActor::commit, std::int64_t{3}).get();
  barrier();
  FileReader saved_by_n((dir.path() / "ckpt-000000003.h5").string());
  for (int world : {1, 2, 3, 4}) expect_reslices(saved_by_n, world);  // N -> 1, 2, 3, 4

  // 1 -> N: a file written by one process alone.
  if (runtime().rank() == 0) {
    FileWriter direct((dir.path() / "single.h5").string());
    for (std::size_t i = 0; i < std::size(kCases); ++i) direct.write_tensor(kCases[i].name, full_tensor(i));
    direct.close();
  }
  barrier();
  FileReader saved_by_one((dir.path() / "single.h5").string());
  for (int world : {2, 4}) expect_reslices(saved_by_one, world);
}

TEST(GatheredSave, AMissingPieceFailsTheCommitNamingTheTensorAndLeavesNoFile) {
  testing::SharedDir dir;
  auto actor = testing::spawn_checkpoint_actor(dir.path(), "ckpt-missing");
  send_my_pieces(actor, 9, /*skip=*/runtime().rank() == 0);
  barrier();
  if (runtime().rank() == 0) {
    try {
      actor.ask(&CheckpointActor::commit, std::int64_t{9}).get();
      ADD_FAILURE() << "commit with a missing piece succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor /model/a.weight has"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("were never sent"), std::string::npos) << e.what();
    }
    for (const auto& entry : fs::directory_iterator(dir.path())) ADD_FAILURE() << "left behind: " << entry.path();
  }
  barrier();
}

// Coverage, not a byte count: a piece sent twice and a piece never sent, of the same
// size, used to pass; so did a negative offset. Each bad piece is refused naming the
// file, tensor, rank and bytes, and fails the save; the last checkpoint stays latest.
TEST(GatheredSave, BadPiecesAreRefusedAndTheLastCheckpointStays) {
  testing::SharedDir dir;
  auto actor = testing::spawn_checkpoint_actor(dir.path(), "ckpt-coverage");
  send_my_pieces(actor, 3);
  barrier();
  if (runtime().rank() == 0) actor.ask(&CheckpointActor::commit, std::int64_t{3}).get();
  barrier();
  struct Bad {
    const char* what;
    std::int64_t elem_offset;
    std::int64_t elements;
    bool repeat;  // the same piece sent again
    const char* says;
  };
  const Bad cases[] = {{"duplicate plus missing", 0, 4, true, "overlaps bytes [0, 16) already written"},
                       {"negative offset", -2, 4, false, "negative offset"},
                       {"past the end", 5, 4, false, "runs past the tensor's 28 bytes"},
                       {"partial overlap", 1, 2, false, "overlaps bytes [0, 16)"}};
  std::int64_t step = 4;
  for (const Bad& bad : cases) {
    if (runtime().rank() == 0) {
      actor.ask(&CheckpointActor::begin, manifest(step)).get();
      const Tensor a = full_tensor(0).reshape({-1});  // /model/a.weight: 7 f32 = 28 bytes
      const Tensor first = a.slice(0, 4);
      send_piece(actor, step, 0, 0, first, 0).get();
      if (bad.repeat || bad.elem_offset != 0) {
        // A negative offset cannot slice the tensor: any 4 elements carry the bytes.
        const Tensor bytes = bad.elem_offset < 0 ? first : a.slice(0, bad.elements);
        try {
          send_piece(actor, step, 0, bad.elem_offset, bytes, 0).get();
          ADD_FAILURE() << bad.what << ": the actor took the piece";
        } catch (const Error& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(bad.says), std::string::npos) << bad.what << ": " << what;
          EXPECT_NE(what.find("/model/a.weight"), std::string::npos) << what;
          EXPECT_NE(what.find("from rank 0"), std::string::npos) << what;
          EXPECT_NE(what.find(".tmp"), std::string::npos) << "names the file: " << what;
        }
      }
      // The rest of every tensor arrives, but the save was failed by the refusal.
      for (std::size_t i = 1; i < std::size(kCases); ++i) {
        const Tensor flat = full_tensor(i).reshape({-1});
        if (flat.numel() > 0) {
          EXPECT_THROW(send_piece(actor, step, static_cast<std::int64_t>(i), 0, flat, 0).get(), Error);
        }
      }
      EXPECT_THROW(actor.ask(&CheckpointActor::commit, step).get(), Error) << bad.what;
      std::vector<std::string> left;
      for (const auto& entry : fs::directory_iterator(dir.path())) left.push_back(entry.path().filename().string());
      std::sort(left.begin(), left.end());
      EXPECT_EQ(left, (std::vector<std::string>{"ckpt-000000003.h5", "latest"})) << bad.what;
    }
    ++step;
    barrier();
  }
}

TEST(GatheredSave, RanksThatDisagreeOnTheManifestAreTold) {
  if (runtime().size() == 1) GTEST_SKIP() << "needs two ranks";
  testing::SharedDir dir;
  auto actor = testing::spawn_checkpoint_actor(dir.path(), "ckpt-manifest");
  if (runtime().rank() == 0) actor.ask(&CheckpointActor::begin, manifest(4)).get();
  barrier();
  if (runtime().rank() == 1) {
    SaveManifest other = manifest(4);
    other.tensors.pop_back();
    EXPECT_THROW(actor.ask(&CheckpointActor::begin, other).get(), Error);
  }
  barrier();
  if (runtime().rank() == 0) actor.ask(&CheckpointActor::discard, std::int64_t{4}).get();
  barrier();
}

}  // namespace
}  // namespace troupe::checkpoint
