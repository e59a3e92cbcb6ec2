// caf_bench: the in-process baseline of bench/run's `actors` area, CAF (the C++ Actor
// Framework, Debian's libcaf-dev 0.17) doing what actors_bench does within one rank:
// tells of an int to a counter actor, then one request that waits for all of them;
// request/reply round trips from a blocking caller (scoped_actor); and no-op tasks, as
// requests to a pool of stateless actors with 1000 in flight. Two scheduler threads, as
// a troupe rank runs one pool thread and one progress thread.
// Prints one JSON object: {"tells_per_s": ..., "ask_us": ..., "tasks_per_s": ..., "threads": 2}.
#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace {

using get_atom = caf::atom_constant<caf::atom("get")>;
using Clock = std::chrono::steady_clock;

caf::behavior counter(caf::event_based_actor*) {
  auto total = std::make_shared<long>(0);
  return {
      [total](int x) { *total += x; },
      [total](get_atom) { return *total; },
      [total](int x, int) { return static_cast<int>(*total += x); },
  };
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Tasks as a CAF user runs them: requests to a pool of stateless function actors,
// kInFlight at a time from an event-based driver, which fulfils `done` at the end.
constexpr int kInFlight = 1000;

caf::behavior noop_worker(caf::event_based_actor*) {
  return {[](int x) { return x; }};
}

void drive_tasks(caf::event_based_actor* self, caf::actor pool, int n, std::promise<void>* done) {
  auto sent = std::make_shared<int>(0), answered = std::make_shared<int>(0);
  auto next = std::make_shared<std::function<void()>>();
  *next = [=] {
    const int i = (*sent)++;
    self->request(pool, caf::infinite, i).then([=](int) {
      if (++*answered == n) return done->set_value();
      if (*sent < n) (*next)();
    });
  };
  for (int i = 0; i < std::min(n, kInFlight); ++i) (*next)();
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 && std::string(argv[1]) == "--quick" ? 1 : 5;
  const int tells = rounds == 1 ? 20000 : 200000;
  const int asks = rounds == 1 ? 2000 : 20000;
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system system{cfg};
  auto target = system.spawn(counter);
  caf::scoped_actor self{system};
  std::vector<double> tell_rates, ask_times;
  for (int r = 0; r < rounds; ++r) {
    auto start = Clock::now();
    for (int i = 0; i < tells; ++i) self->send(target, 1);
    self->request(target, caf::infinite, get_atom::value).receive([](long) {}, [](caf::error&) { std::abort(); });
    tell_rates.push_back(tells / seconds_since(start));
    start = Clock::now();
    for (int i = 0; i < asks; ++i) {
      self->request(target, caf::infinite, 1, 0).receive([](int) {}, [](caf::error&) { std::abort(); });
    }
    ask_times.push_back(seconds_since(start) / asks * 1e6);
  }
  // Tasks: a round-robin pool of two stateless workers (one per scheduler thread).
  const int tasks = rounds == 1 ? 10000 : 100000;
  auto pool = caf::actor_pool::make(
      system.dummy_execution_unit(), 2, [&] { return system.spawn(noop_worker); }, caf::actor_pool::round_robin());
  std::vector<double> task_rates;
  for (int r = 0; r < rounds; ++r) {
    std::promise<void> done;
    const auto start = Clock::now();
    system.spawn(drive_tasks, pool, tasks, &done);
    done.get_future().wait();
    task_rates.push_back(tasks / seconds_since(start));
  }
  anon_send_exit(pool, caf::exit_reason::user_shutdown);
  std::sort(tell_rates.begin(), tell_rates.end());
  std::sort(ask_times.begin(), ask_times.end());
  std::sort(task_rates.begin(), task_rates.end());
  std::printf("{\"tells_per_s\": %.1f, \"ask_us\": %.3f, \"tasks_per_s\": %.1f, \"threads\": 2}\n",
              tell_rates[tell_rates.size() / 2], ask_times[ask_times.size() / 2], task_rates[task_rates.size() / 2]);
  return 0;
}
