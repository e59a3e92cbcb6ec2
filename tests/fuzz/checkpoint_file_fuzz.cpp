// Fuzz target: a checkpoint file of arbitrary bytes, read as troupe-ckpt verify and
// show do: open, root attributes, every group's attributes and tensors, each tensor
// read and checksummed, then verify_all. A damaged file must be refused with a
// troupe error (FormatError, CheckpointError) naming it; a crash, a hang or an
// allocation the file cannot back is a finding -- in troupe or in libhdf5 beneath it.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/error.hpp"

namespace {
std::string scratch_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/troupe-fuzz-ckpt-" + std::to_string(getpid()) + ".h5";
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = scratch_path();
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    std::abort();
  }
  try {
    troupe::checkpoint::FileReader reader(path);
    reader.attributes("/");
    for (const auto& group : reader.child_groups("/")) reader.attributes("/" + group);
    for (const auto& info : reader.tensors("/")) reader.read(info.path);
    reader.verify_all();
  } catch (const troupe::Error&) {
  }
  std::remove(path.c_str());
  return 0;
}
