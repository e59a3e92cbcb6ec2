// The NCCL backend needs a GPU; without one (or in a build without CUDA) these skip.
#include "test_world.hpp"
#include "troupe/tensor/device.hpp"

namespace troupe::collectives::testing {
namespace {

TEST(Nccl, SkipsCleanlyWithoutAGpu) {
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device here";
  SUCCEED();
}

}  // namespace
}  // namespace troupe::collectives::testing
