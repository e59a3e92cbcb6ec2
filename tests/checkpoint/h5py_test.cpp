// A checkpoint written by troupe, read by plain h5py with no troupe code
// (tests/checkpoint/check_with_h5py.py), and through tools/load_in_torch.py's h5py part.
#include <gtest/gtest.h>

#include <cstdlib>

#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"

namespace troupe::checkpoint {
namespace {

using tensor::DType;
using tensor::Tensor;

// Known values the Python side checks element by element.
void write_known_checkpoint(const std::filesystem::path& folder) {
  Checkpoint ckpt(folder, 3);
  ckpt.set_run_info({.run_id = "h5py-run", .config_json = "{\"model\": \"mlp\", \"lr\": 0.5}", .world_size = 4});
  ckpt.register_state("model",
                      {.save =
                           [](SectionWriter& w) {
                             w.tensor("layers.0.weight", Tensor::arange(0, 12, 1, DType::f32).reshape({3, 4}));
                             w.tensor("layers.0.bias", Tensor::arange(0, 3, 1, DType::f64));
                             w.tensor("half", Tensor::arange(0, 6, 1, DType::f32).to(DType::f16).reshape({2, 3}));
                             w.tensor("brain", Tensor::from_vector<float>({1.0f, 2.0f, -0.5f}).to(DType::bf16));
                             w.tensor("ids", Tensor::arange(-2, 3, 1, DType::i64));
                             w.tensor("count", Tensor::arange(5, 7, 1, DType::i32));
                             w.tensor("mask", Tensor::arange(250, 256, 1, DType::u8));
                             w.tensor("scalar", Tensor::full({}, 7.5, DType::f32));
                           },
                       .load = [](const SectionReader&) {}});
  ckpt.register_state("optimizer", {.save =
                                        [](SectionWriter& w) {
                                          w.attribute("lr", 0.5);
                                          w.attribute("step", std::int64_t{9});
                                          w.tensor("layers.0.weight/exp_avg", Tensor::full({3, 4}, 0.25));
                                        },
                                    .load = [](const SectionReader&) {}});
  ckpt.register_state("sampler", {.save =
                                      [](SectionWriter& w) {
                                        w.attribute("epoch", std::int64_t{2});
                                        w.attribute("index", std::int64_t{640});
                                      },
                                  .load = [](const SectionReader&) {}});
  ckpt.save(42, 2);
}

int run_python(const std::string& script, const std::string& args) {
  std::string cmd = "/usr/bin/python3 " + script + " " + args;
  return std::system(cmd.c_str());
}

TEST(H5py, ReadsNamesShapesDTypesValuesAndAttributesWithoutTroupe) {
  testing::TempDir dir;
  write_known_checkpoint(dir.path());
  std::string file = (dir / "ckpt-000000042.h5").string();
  EXPECT_EQ(run_python(TROUPE_SOURCE_DIR "/tests/checkpoint/check_with_h5py.py", file), 0);
}

TEST(H5py, LoadInTorchScriptBuildsTheStateDict) {
  testing::TempDir dir;
  write_known_checkpoint(dir.path());
  std::string file = (dir / "ckpt-000000042.h5").string();
  EXPECT_EQ(run_python(TROUPE_SOURCE_DIR "/tests/checkpoint/check_load_in_torch.py", file), 0);
}

}  // namespace
}  // namespace troupe::checkpoint
