// Rank 1 lets an exception escape main while rank 0 waits on it: the job must end
// with a message naming rank 1 (MPI_Abort), not hang. CTest checks the message.
#include <chrono>
#include <stdexcept>
#include <thread>

#include "troupe/actors/runtime.hpp"

namespace {
struct Sleeper {
  int nap(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  }
  static constexpr auto troupe_methods = troupe::methods<&Sleeper::nap>;
};
}  // namespace

int main(int argc, char** argv) {
  troupe::Runtime rt(argc, argv);
  auto sleepers = rt.spawn_on_each<Sleeper>();
  if (rt.rank() == 1) throw std::runtime_error("deliberate failure on rank 1");
  sleepers[1].ask(&Sleeper::nap, 60000).get();  // would wait a minute; the abort ends it
  return 0;
}
