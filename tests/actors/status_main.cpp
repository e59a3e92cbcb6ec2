// A job for `troupe-run status`: a named actor on the last rank naps for the given
// milliseconds while rank 0 waits for it, then every rank shuts down.
//
//   troupe-run -np 2 --checkpoint-dir DIR -- actors_status 3000
#include <chrono>
#include <cstdlib>
#include <thread>

#include "troupe/actors/runtime.hpp"

namespace {
struct Napper {
  int nap(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  }
  static constexpr auto troupe_methods = troupe::methods<&Napper::nap>;
};
}  // namespace

int main(int argc, char** argv) {
  troupe::Runtime rt(argc, argv);
  const int ms = argc > 1 ? std::atoi(argv[1]) : 3000;
  if (rt.rank() == 0) {
    troupe::SpawnOptions options;
    options.name = "napper";
    auto napper = rt.spawn_with<Napper>(rt.size() - 1, options);
    auto first = napper.ask(&Napper::nap, ms);
    auto second = napper.ask(&Napper::nap, 1);  // waits in the mailbox meanwhile
    first.get();
    second.get();
  }
  rt.shutdown();
}
