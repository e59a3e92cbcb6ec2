// Helpers for the multi-rank checkpoint tests (gathered_main.cpp runs them).
#pragma once

#include <chrono>
#include <memory>
#include <thread>

#include "test_util.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/checkpoint/checkpoint_actor.hpp"

namespace troupe::checkpoint::testing {

Runtime& runtime();
// Every rank together; waits without spinning a core away from the others.
void barrier();

// A tensor of a test's state: its full name, dtype and shape.
struct TensorCase {
  const char* name;
  tensor::DType dtype;
  tensor::Shape shape;
};

// A CheckpointActor (keep_last 2) saving into `folder`, spawned by rank 0 on the last
// rank (so that rank 0's pieces cross the wire too) under `name`; collective.
actors::ActorRef<CheckpointActor> spawn_checkpoint_actor(const std::filesystem::path& folder, const std::string& name);

// A scratch folder made by rank 0 and known to every rank (all ranks share the host);
// removed by rank 0 after a closing barrier.
class SharedDir {
 public:
  SharedDir();
  ~SharedDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::unique_ptr<TempDir> owned_;
};

}  // namespace troupe::checkpoint::testing
