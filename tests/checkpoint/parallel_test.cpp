// The parallel save: every rank writes its own slices into one file (rank 0 lays out
// the HDF5 structure). The file equals the gathered save's tensor for tensor, verifies, re-slices for
// other world sizes and reads in plain h5py; bad slices and ranks that disagree fail on
// every rank and leave the previous checkpoint as it was.
#include <gtest/gtest.h>
#include <mpi.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdlib>

#include "gathered_world.hpp"
#include "troupe/checkpoint/checkpoint_actor.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/parallel_checkpoint.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Shape;
using tensor::Tensor;
using testing::barrier;
using testing::runtime;

using Case = testing::TensorCase;
// Fewer rows than 4 ranks (3 rows: a rank gets 0 rows), 1-D, bf16 and f16, a 0-dim one
// (one rank holds it), an empty one (nobody holds anything), 3-D, and one of 1 MB.
const Case kSliceCases[] = {{"/model/embed.weight", DType::f32, {10, 6}},
                            {"/model/few_rows", DType::bf16, {3, 5}},
                            {"/model/bias", DType::f32, {7}},
                            {"/model/ids", DType::i64, {5}},
                            {"/model/scale", DType::f64, {}},
                            {"/model/empty", DType::f32, {0, 4}},
                            {"/model/conv", DType::f32, {4, 3, 2}},
                            {"/model/big", DType::f32, {256, 1024}},
                            {"/optimizer/embed.weight/exp_avg", DType::f16, {10, 6}}};
constexpr std::size_t kBias = 2;

Tensor full_case(std::size_t i) {
  return testing::random_tensor(kSliceCases[i].shape, kSliceCases[i].dtype, 200 + static_cast<std::uint32_t>(i));
}

SaveManifest slice_manifest(std::int64_t step) {
  SaveManifest m;
  m.step = step;
  m.epoch = 3;
  m.world_size = runtime().size();
  m.run_id = "parallel";
  for (const Case& c : kSliceCases) m.add_tensor(c.name, c.dtype, c.shape);
  m.attributes.push_back({"/sampler", "index", AttrValue(std::int64_t{640})});
  m.attributes.push_back({"/optimizer", "lr", AttrValue(0.5)});
  return m;
}

// This rank's slice of tensor i: its rows (dim 0 split by shard_range, so a rank may get
// none) or its flat element range (pieces that cut rows in the middle). A 0-dim tensor
// belongs to the last rank.
enum class Split { rows, flat };
Slice my_slice(std::size_t i, Split split) {
  Tensor full = full_case(i);
  int rank = runtime().rank(), world = runtime().size();
  if (full.dim() == 0) return rank == world - 1 ? Slice{0, full} : Slice{};
  if (split == Split::rows) {
    auto [b, e] = shard_range(full.size(0), rank, world);
    return Slice::rows(b, full.slice(b, e));
  }
  Tensor flat = full.reshape({-1});
  auto [b, e] = shard_range(flat.numel(), rank, world);
  return Slice{b, flat.slice(b, e)};
}

std::vector<Slice> my_slices(Split split) {
  std::vector<Slice> out;
  for (std::size_t i = 0; i < std::size(kSliceCases); ++i) out.push_back(my_slice(i, split));
  return out;
}

int run(const std::string& cmd) {
  int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void expect_whole_file(const fs::path& file, std::int64_t step) {
  FileReader reader(file.string());
  EXPECT_NO_THROW(reader.verify_all());
  std::vector<TensorInfo> listed = reader.tensors("/");
  ASSERT_EQ(listed.size(), std::size(kSliceCases));
  for (std::size_t i = 0; i < std::size(kSliceCases); ++i) {
    EXPECT_EQ(listed[i].path, kSliceCases[i].name);  // manifest order
    EXPECT_TRUE(testing::same_bits(reader.read(kSliceCases[i].name), full_case(i))) << kSliceCases[i].name;
  }
  Attributes root = reader.attributes("/");
  EXPECT_EQ(root.get_string("format"), "troupe-checkpoint");
  EXPECT_EQ(root.get_int("step"), step);
  EXPECT_EQ(root.get_int("epoch"), 3);
  EXPECT_EQ(root.get_int("world_size"), runtime().size());
  EXPECT_EQ(root.get_string("run_id"), "parallel");
  EXPECT_EQ(root.get_int("complete"), 1);
  EXPECT_EQ(reader.attributes("/sampler").get_int("index"), 640);
  EXPECT_EQ(reader.attributes("/optimizer").get_double("lr"), 0.5);
}

TEST(ParallelSave, WritesEveryRanksRowsIntoOneFileThatVerifies) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  fs::path file = ckpt.save(slice_manifest(5), slices);
  EXPECT_EQ(file, dir.path() / "ckpt-000000005.h5");  // on every rank
  expect_whole_file(file, 5);
  if (runtime().rank() == 0) {
    EXPECT_EQ(ckpt.directory().latest_pointer(), file);
    EXPECT_EQ(run(std::string(TROUPE_CKPT_BINARY) + " verify " + dir.path().string() + " > /dev/null"), 0);
  }
  barrier();
}

// The default writes each rank's bytes with pwrite at the dataset's address; collective
// buffering sends them through MPI-IO's aggregators instead. Same file either way.
TEST(ParallelSave, CollectiveBufferingWritesTheSameTensors) {
  testing::SharedDir direct_dir, buffered_dir;
  std::vector<Slice> slices = my_slices(Split::flat);
  ParallelCheckpoint direct(direct_dir.path(), 1, MPI_COMM_WORLD);
  ParallelCheckpoint buffered(buffered_dir.path(), 1, MPI_COMM_WORLD, ParallelOptions{.collective_buffering = true});
  fs::path a = direct.save(slice_manifest(6), slices), b = buffered.save(slice_manifest(6), slices);
  expect_whole_file(a, 6);
  expect_whole_file(b, 6);
  if (runtime().rank() == 0) {
    EXPECT_EQ(run(std::string(TROUPE_CKPT_BINARY) + " diff " + a.string() + " " + b.string() + " > /dev/null"), 0);
  }
  barrier();
}

TEST(ParallelSave, KeepsTheLastNCheckpointsAndRemovesOlderOnesAfterCommitting) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  for (std::int64_t step : {1, 2, 3}) ckpt.save(slice_manifest(step), slices);
  if (runtime().rank() == 0) {
    std::vector<fs::path> kept = ckpt.directory().list();
    ASSERT_EQ(kept.size(), 2u);
    EXPECT_EQ(kept[0].filename(), "ckpt-000000002.h5");
    EXPECT_EQ(kept[1].filename(), "ckpt-000000003.h5");
    EXPECT_EQ(ckpt.directory().latest_pointer(), kept[1]);
  }
  barrier();
}

TEST(ParallelSave, EqualsTheGatheredSaveOfTheSameSlicesTensorForTensor) {
  testing::SharedDir parallel_dir, gathered_dir;
  std::vector<Slice> slices = my_slices(Split::flat);
  ParallelCheckpoint ckpt(parallel_dir.path(), 2, MPI_COMM_WORLD);
  fs::path parallel = ckpt.save(slice_manifest(8), slices);

  auto actor = testing::spawn_checkpoint_actor(gathered_dir.path(), "ckpt-versus-parallel");
  actor.ask(&CheckpointActor::begin, slice_manifest(8)).get();
  std::vector<actors::Future<void>> sent;
  for (std::size_t i = 0; i < slices.size(); ++i)
    if (slices[i].data.defined() && slices[i].data.numel() > 0)
      sent.push_back(
          send_piece(actor, 8, static_cast<std::int64_t>(i), slices[i].begin, slices[i].data, runtime().rank()));
  for (auto& f : sent) f.get();
  barrier();
  fs::path gathered = gathered_dir.path() / "ckpt-000000008.h5";
  if (runtime().rank() == 0) actor.ask(&CheckpointActor::commit, std::int64_t{8}).get();
  barrier();

  FileReader a(parallel.string()), b(gathered.string());
  std::vector<TensorInfo> ta = a.tensors("/"), tb = b.tensors("/");
  ASSERT_EQ(ta.size(), tb.size());
  for (std::size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].path, tb[i].path);
    EXPECT_EQ(ta[i].dtype, tb[i].dtype) << ta[i].path;
    EXPECT_EQ(ta[i].shape, tb[i].shape) << ta[i].path;
    EXPECT_EQ(ta[i].checksum, tb[i].checksum) << ta[i].path;  // the chained hash is the whole tensor's
    EXPECT_TRUE(testing::same_bits(a.read(ta[i].path), b.read(tb[i].path))) << ta[i].path;
  }
  expect_whole_file(parallel, 8);
  if (runtime().rank() == 0) {  // diff(1)'s convention: 0 is identical, tensors and attributes
    EXPECT_EQ(
        run(std::string(TROUPE_CKPT_BINARY) + " diff " + parallel.string() + " " + gathered.string() + " > /dev/null"),
        0);
  }
  barrier();
}

TEST(ParallelSave, LoadsIntoOtherWorldSizesByReslicing) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  FileReader file(ckpt.save(slice_manifest(4), slices).string());
  for (int world : {1, 2, 3, 4}) {
    // Ranks [0, world) of another job take their shard; the ranks present play them in turn.
    for (int q = runtime().rank(); q < world; q += runtime().size()) {
      for (std::size_t i = 0; i < std::size(kSliceCases); ++i) {
        Tensor flat = full_case(i).reshape({-1});
        auto [b, e] = shard_range(flat.numel(), q, world);
        EXPECT_TRUE(testing::same_bits(file.read_range(kSliceCases[i].name, b, e), flat.slice(b, e).clone()))
            << kSliceCases[i].name << " rank " << q << " of " << world;
      }
    }
  }
  barrier();
}

// The values tests/checkpoint/check_with_h5py.py and check_load_in_torch.py expect (the
// same file h5py_test.cpp writes with one process), each tensor cut across the ranks.
TEST(ParallelSave, H5pyAndLoadInTorchReadItWithoutTroupe) {
  testing::SharedDir dir;
  std::vector<std::pair<std::string, Tensor>> known = {
      {"/model/layers.0.weight", Tensor::arange(0, 12, 1, DType::f32).reshape({3, 4})},
      {"/model/layers.0.bias", Tensor::arange(0, 3, 1, DType::f64)},
      {"/model/half", Tensor::arange(0, 6, 1, DType::f32).to(DType::f16).reshape({2, 3})},
      {"/model/brain", Tensor::from_vector<float>({1.0f, 2.0f, -0.5f}).to(DType::bf16)},
      {"/model/ids", Tensor::arange(-2, 3, 1, DType::i64)},
      {"/model/count", Tensor::arange(5, 7, 1, DType::i32)},
      {"/model/mask", Tensor::arange(250, 256, 1, DType::u8)},
      {"/model/scalar", Tensor::full({}, 7.5, DType::f32)},
      {"/optimizer/layers.0.weight/exp_avg", Tensor::full({3, 4}, 0.25)}};
  SaveManifest m;
  m.step = 42;
  m.epoch = 2;
  m.world_size = runtime().size();
  m.run_id = "h5py-run";
  m.config_json = "{\"model\": \"mlp\", \"lr\": 0.5}";
  std::vector<Slice> slices;
  for (const auto& [name, t] : known) {
    m.add_tensor(name, t.dtype(), t.shape());
    if (t.dim() == 0) {
      slices.push_back(runtime().rank() == 0 ? Slice{0, t} : Slice{});
      continue;
    }
    auto [b, e] = shard_range(t.numel(), runtime().rank(), runtime().size());
    slices.push_back(Slice{b, t.reshape({-1}).slice(b, e)});
  }
  m.attributes = {{"/optimizer", "lr", AttrValue(0.5)},
                  {"/optimizer", "step", AttrValue(std::int64_t{9})},
                  {"/sampler", "epoch", AttrValue(std::int64_t{2})},
                  {"/sampler", "index", AttrValue(std::int64_t{640})}};
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::string file = ckpt.save(m, slices).string();
  if (runtime().rank() == 0) {
    std::string scripts = TROUPE_SOURCE_DIR "/tests/checkpoint/";
    EXPECT_EQ(
        run("/usr/bin/python3 " + scripts + "check_with_h5py.py " + file + " " + std::to_string(runtime().size())), 0);
    EXPECT_EQ(run("/usr/bin/python3 " + scripts + "check_load_in_torch.py " + file), 0);
  }
  barrier();
}

// Runs `save` on every rank and expects the same kind of refusal everywhere, naming
// every one of `words`; then the folder holds exactly the step-1 checkpoint, whole.
// After a failed save of step 2: the folder holds step 1's checkpoint, whole, and
// `latest` pointing at it, and nothing else. Collective.
void expect_only_the_first_checkpoint(const testing::SharedDir& dir) {
  barrier();
  if (runtime().rank() == 0) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir.path())) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"ckpt-000000001.h5", "latest"}));
    EXPECT_EQ(CheckpointDirectory(dir.path()).latest_pointer(), dir.path() / "ckpt-000000001.h5");
  }
  expect_whole_file(dir.path() / "ckpt-000000001.h5", 1);
  barrier();
}

template <class Save>
void expect_refused_everywhere(const testing::SharedDir& dir, Save&& save, std::vector<std::string> words) {
  try {
    save();
    ADD_FAILURE() << "the save succeeded on rank " << runtime().rank();
  } catch (const InvalidArgument& e) {
    for (const std::string& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "no '" << w << "' in: " << e.what();
  }
  expect_only_the_first_checkpoint(dir);
}

TEST(ParallelSave, OverlappingSlicesFailOnEveryRankAndKeepThePreviousCheckpoint) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  ckpt.save(slice_manifest(1), slices);
  if (runtime().rank() == 1) {  // one element of rank 0's too
    Tensor flat = full_case(kBias);
    slices[kBias] = Slice{slices[kBias].begin - 1,
                          flat.slice(slices[kBias].begin - 1, slices[kBias].begin + slices[kBias].data.numel())};
  }
  expect_refused_everywhere(dir, [&] { ckpt.save(slice_manifest(2), slices); },
                            {"/model/bias", "rank 0's slice [0, ", "rank 1's slice", "overlap"});
}

// One rank's storage fails (RLIMIT_FSIZE there: its writes past 4 KB fail with EFBIG,
// as one node's full disk fails them with ENOSPC): the save fails on every rank, naming
// that rank, and leaves the previous checkpoint and nothing else.
TEST(ParallelSave, AWriteThatFailsOnOneRankFailsTheSaveOnEveryRankAndKeepsThePreviousCheckpoint) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  ckpt.save(slice_manifest(1), slices);
  const int victim = runtime().size() - 1;
  struct sigaction ignore {
  }, old{};
  rlimit saved{};
  if (runtime().rank() == victim) {
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGXFSZ, &ignore, &old);
    ::getrlimit(RLIMIT_FSIZE, &saved);
    rlimit tight = saved;
    tight.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &tight);
  }
  std::string what;
  try {
    ckpt.save(slice_manifest(2), slices);
    ADD_FAILURE() << "the save succeeded on rank " << runtime().rank();
  } catch (const Error& e) {
    what = e.what();
  }
  if (runtime().rank() == victim) {
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::sigaction(SIGXFSZ, &old, nullptr);
  }
  EXPECT_NE(what.find("rank " + std::to_string(victim) + " of"), std::string::npos) << what;
  expect_only_the_first_checkpoint(dir);
}

TEST(ParallelSave, SlicesThatLeaveAGapFailOnEveryRankAndKeepThePreviousCheckpoint) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  ckpt.save(slice_manifest(1), slices);
  if (runtime().rank() == 1) slices[kBias].data = slices[kBias].data.slice(0, slices[kBias].data.numel() - 1);
  expect_refused_everywhere(dir, [&] { ckpt.save(slice_manifest(2), slices); }, {"/model/bias", "in no rank's slice"});
}

TEST(ParallelSave, RanksWithDifferentShapesAreToldWhichTensorDiffersOnEveryRank) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  ckpt.save(slice_manifest(1), slices);
  SaveManifest other = slice_manifest(2);
  if (runtime().rank() == 1) other.tensors[6].shape = {4, 3, 3};
  expect_refused_everywhere(
      dir, [&] { ckpt.save(other, slices); },
      {"rank 0 has 'tensor /model/conv f32 [4, 3, 2]'", "rank 1 has 'tensor /model/conv f32 [4, 3, 3]'"});
}

TEST(ParallelSave, ASliceOfTheWrongDTypeOnOneRankFailsOnEveryRank) {
  testing::SharedDir dir;
  ParallelCheckpoint ckpt(dir.path(), 2, MPI_COMM_WORLD);
  std::vector<Slice> slices = my_slices(Split::rows);
  ckpt.save(slice_manifest(1), slices);
  if (runtime().rank() == 1) slices[kBias].data = slices[kBias].data.to(DType::f64);
  expect_refused_everywhere(dir, [&] { ckpt.save(slice_manifest(2), slices); },
                            {"rank 1 of", "/model/bias", "the slice is f64, the tensor f32"});
}

TEST(ParallelWriter, RanksThatWriteDifferentTensorsAreStoppedBeforeHdf5OnEveryRank) {
  testing::SharedDir dir;
  std::string path = (dir.path() / "direct.h5").string();
  {
    ParallelWriter file(path, MPI_COMM_WORLD);
    TensorSpec spec{"/model/x", "f32", {runtime().rank() == 1 ? 5 : 4}};
    EXPECT_THROW(
        {
          try {
            file.write(spec, Slice{});
          } catch (const InvalidArgument& e) {
            EXPECT_NE(
                std::string(e.what()).find("rank 0 has 'write /model/x f32 [4]', rank 1 has 'write /model/x f32 [5]'"),
                std::string::npos)
                << e.what();
            throw;
          }
        },
        InvalidArgument);
    // Still in step: the same writer goes on, and a good tensor is written whole.
    Tensor t = Tensor::arange(0, 8, 1, DType::f32);
    auto [b, e] = shard_range(8, runtime().rank(), runtime().size());
    file.write({"/model/y", "f32", {8}}, Slice{b, t.slice(b, e)});
    file.close();
  }
  FileReader reader(path);
  EXPECT_TRUE(testing::same_bits(reader.read("/model/y"), Tensor::arange(0, 8, 1, DType::f32)));
  barrier();
}

}  // namespace
}  // namespace troupe::checkpoint
