// One checkpoint operation for storage_drill_test.py, which runs it under
// libtroupe_iofault.so with each storage call failing in turn.
//
//   storage_drill save DIR STEP   saves the state of STEP (keep_last 2); exit 0 once it
//                                 is durable (acknowledged), 3 when it failed loudly
//   storage_drill psave DIR STEP  the same through ParallelCheckpoint (MPI-IO, one rank)
//   storage_drill resume DIR      load_latest; prints "step N" and checks every byte of
//                                 the state against step N's: exit 0; "fresh" and exit 4
//                                 when nothing was resumed; 3 when it failed loudly;
//                                 5 when the bytes are not step N's (a torn file taken)
//
// The state is a function of the step, so any file's contents can be checked.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/parallel_checkpoint.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/environment.hpp"

namespace {

using namespace troupe;

tensor::Tensor state_of(std::int64_t step, int i) {
  tensor::Tensor t = tensor::Tensor::empty({64, 256 + 64 * i}, tensor::DType::f32);
  std::mt19937 gen(static_cast<std::uint32_t>(step * 100 + i));
  auto* p = static_cast<std::uint32_t*>(t.raw_data());
  for (std::int64_t k = 0; k < t.numel(); ++k) p[k] = gen();
  return t;
}

constexpr int kTensors = 3;

// The same file as the serial save, written by ParallelCheckpoint on one rank.
int parallel_save(const char* dir, std::int64_t step) {
  mpi::Environment env;
  checkpoint::ParallelCheckpoint ckpt(dir, 2, MPI_COMM_WORLD);
  checkpoint::SaveManifest manifest;
  manifest.step = step;
  manifest.groups = {"/model"};
  manifest.attributes.push_back({"/model", "step", step});
  std::vector<checkpoint::Slice> slices;
  for (int i = 0; i < kTensors; ++i) {
    tensor::Tensor t = state_of(step, i);
    manifest.add_tensor("/model/t" + std::to_string(i), t.dtype(), t.shape());
    slices.push_back(checkpoint::Slice::rows(0, t));
  }
  ckpt.save(manifest, slices);
  std::printf("saved %lld\n", static_cast<long long>(step));
  return 0;
}

int run(int argc, char** argv) {
  const std::string mode = argc > 2 ? argv[1] : "";
  if (!((mode == "save" || mode == "psave") && argc == 4) && !(mode == "resume" && argc == 3)) {
    std::fprintf(stderr, "usage: storage_drill save|psave DIR STEP | resume DIR\n");
    return 2;
  }
  if (mode == "psave") return parallel_save(argv[2], std::atoll(argv[3]));
  checkpoint::Checkpoint ckpt(argv[2], 2);
  const std::int64_t step = mode == "save" ? std::atoll(argv[3]) : 0;
  bool torn = false;
  std::int64_t loaded_at = -1;
  ckpt.register_state("model", {.save =
                                    [step](checkpoint::SectionWriter& w) {
                                      w.attribute("step", step);
                                      for (int i = 0; i < kTensors; ++i)
                                        w.tensor("t" + std::to_string(i), state_of(step, i));
                                    },
                                .load =
                                    [&torn, &loaded_at](const checkpoint::SectionReader& r) {
                                      const std::int64_t at = loaded_at = r.attributes().get_int("step");
                                      for (int i = 0; i < kTensors; ++i) {
                                        const tensor::Tensor got = r.tensor("t" + std::to_string(i));
                                        const tensor::Tensor want = state_of(at, i);
                                        torn |= got.nbytes() != want.nbytes() ||
                                                std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()) != 0;
                                      }
                                    }});
  if (mode == "save") {
    ckpt.save(step);
    std::printf("saved %lld\n", static_cast<long long>(step));
    return 0;
  }
  const auto meta = ckpt.load_latest();
  if (!meta) {
    std::printf("fresh\n");
    return 4;
  }
  std::printf("step %lld\n", static_cast<long long>(meta->step));
  return torn || loaded_at != meta->step ? 5 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const troupe::Error& e) {
    std::printf("failed: %s\n", e.what());
    return 3;
  }
}
