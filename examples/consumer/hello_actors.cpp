// Two ranks, one actor each: rank 0 asks rank 1's Counter, then every rank's at once.
//   mpirun -np 2 ./hello_actors
#include <cstdio>

#include "troupe/actors/runtime.hpp"
#include "troupe/version.hpp"

struct Counter {
  explicit Counter(int start) : value(start) {}
  int add(int x) { return value += x; }
  int value;
  static constexpr auto troupe_methods = troupe::methods<&Counter::add>;
};

int main(int argc, char** argv) {
  troupe::Runtime runtime(argc, argv);
  if (runtime.rank() == 0) {
    std::printf("troupe %s (headers %s), %d ranks\n", troupe::version(), TROUPE_VERSION_STRING, runtime.size());
    auto counter = runtime.spawn<Counter>(runtime.size() - 1, 10);
    std::printf("10 + 5 on rank %d = %d\n", runtime.size() - 1, counter.ask(&Counter::add, 5).get());
  }
  auto all = runtime.spawn_on_each<Counter>(100);  // collective: one per rank
  if (runtime.rank() == 0) {
    int total = 0;
    for (int sum : troupe::when_all(all.ask(&Counter::add, 1)).get()) total += sum;
    std::printf("every rank's 100 + 1, summed: %d\n", total);
  }
  runtime.shutdown();
}
