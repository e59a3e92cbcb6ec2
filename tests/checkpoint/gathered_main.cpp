// The checkpoint actor under mpirun: gathered saves from every rank's shards, and
// re-sliced loads for other world sizes. One Runtime for the binary; every test runs on
// every rank and ends with a barrier.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "../rank_report.hpp"
#include "gathered_world.hpp"

namespace troupe::checkpoint::testing {
namespace {
Runtime* g_runtime = nullptr;
}  // namespace

Runtime& runtime() { return *g_runtime; }

void barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

actors::ActorRef<CheckpointActor> spawn_checkpoint_actor(const std::filesystem::path& folder, const std::string& name) {
  if (runtime().rank() == 0)
    runtime().spawn_with<CheckpointActor>(runtime().size() - 1, SpawnOptions{.name = name}, folder.string(),
                                          std::int64_t{2});
  barrier();
  return runtime().lookup<CheckpointActor>(name);
}

SharedDir::SharedDir() {
  char buf[256] = {};
  if (runtime().rank() == 0) {
    TempDir* dir = new TempDir();  // owned below, by rank 0 only
    owned_.reset(dir);
    std::snprintf(buf, sizeof buf, "%s", dir->path().c_str());
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  path_ = buf;
}

SharedDir::~SharedDir() { barrier(); }

}  // namespace troupe::checkpoint::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  troupe::Runtime rt(argc, argv);
  troupe::checkpoint::testing::g_runtime = &rt;
  troupe::test_support::report_failures_only(rt.rank());
  const int failed = RUN_ALL_TESTS();
  rt.shutdown();
  return failed ? 1 : 0;
}
