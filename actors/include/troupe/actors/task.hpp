// Tasks: a free function run on some rank, as Ray's `f.remote(x)`.
//
//   int square(int x) { return x * x; }
//   auto f = rt.submit<&square>(7);                          // the least busy rank
//   auto g = rt.submit<&square>(TaskOptions{.rank = 2}, 7);  // rank 2
//   auto all = rt.map<&square>(std::vector<int>{1, 2, 3});   // Future<std::vector<int>>
//
// Every rank runs the same binary, so naming the function as a template argument
// registers it in every process before main, as spawn<T> does for actor types. A task
// runs on the chosen rank's pool (a built-in actor, "tasks", with a concurrency group
// of 16 lanes, so long tasks run at once on as many threads as the rank has, and
// short ones share a lane: Scheduler::lane_for), and its
// result comes back as an ask's does: cancel() and deadlines work alike, and the task
// runners show in Runtime::actors().
//
// Placement: without a rank, the rank to which this rank has the fewest tasks in
// flight (ties in turn), never a rank known lost. A task marked with retries is run
// again elsewhere when its rank is lost before it answers -- only for functions that
// may run twice (idempotent): the lost rank may have run it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/actors/actor_ref.hpp"

namespace troupe::actors {

namespace detail {

template <class F>
struct FunctionTraits;
template <class R, class... A>
struct FunctionTraits<R (*)(A...)> {
  using Result = std::decay_t<R>;
  using Args = std::tuple<std::decay_t<A>...>;
};
template <class R, class... A>
struct FunctionTraits<R (*)(A...) noexcept> : FunctionTraits<R (*)(A...)> {};

using TaskInvoker = void (*)(std::string_view args, std::string& result);
// Registers a task function under a 64-bit hash of its compiler-spelled signature (a
// task message carries 8 bytes, not the text); returns the key. Two signatures with
// one hash are refused at use: check_task throws InvalidArgument naming both.
std::uint64_t register_task(const std::string& signature, TaskInvoker invoke);
void check_task(std::uint64_t key);
// "square" from task_signature<&square>()'s text.
std::string task_name(std::string_view signature);

template <auto F>
std::string task_signature() {
  return __PRETTY_FUNCTION__;
}

template <auto F>
void invoke_task(std::string_view bytes, std::string& result) {
  using Traits = FunctionTraits<decltype(F)>;
  typename Traits::Args args;
  parse_exactly(bytes, "task arguments", args);
  if constexpr (std::is_void_v<typename Traits::Result>)
    std::apply([](auto&... a) { F(std::move(a)...); }, args);
  else
    append_serialized(result, std::apply([](auto&... a) { return F(std::move(a)...); }, args));
}

template <auto F>
struct TaskKey {
  static inline const std::uint64_t key = register_task(task_signature<F>(), &invoke_task<F>);
  static inline const std::string name = task_name(task_signature<F>());
};

// The built-in actor that runs tasks on its rank.
struct TaskRunner {
  std::string run(std::uint64_t key, std::string args);
  static constexpr std::string_view troupe_name = "tasks";
  static constexpr auto troupe_methods = methods<&TaskRunner::run>;
  static constexpr auto troupe_concurrency = concurrency(group<16, &TaskRunner::run>("tasks"));
};

template <class R>
R parse_task_result(const std::string& bytes) {
  if constexpr (std::is_void_v<R>) {
    parse_exactly(bytes, "task result");
  } else {
    R value{};
    parse_exactly(bytes, "task result", value);
    return value;
  }
}

// One task: its output, the bytes of its arguments (kept while retries remain) and
// the attempt running now, which cancel() reaches.
template <class R>
struct TaskRun {
  std::uint64_t key = 0;
  std::string args;
  TaskOptions options;
  std::shared_ptr<State<R>> out;
  std::mutex mutex;
  Future<std::string> attempt;
};

// `requested`: the rank asked for, or -1; a retry goes wherever there is room.
template <class R>
void start_task(Runtime& rt, const std::shared_ptr<TaskRun<R>>& task, int retries_left, int requested) {
  const int rank = rt.place_task(requested);
  ActorRef<TaskRunner> runner(&rt, rank, rt.task_runner(rank));
  Future<std::string> attempt =
      runner.ask(&TaskRunner::run, task->key, retries_left > 0 ? task->args : std::move(task->args));
  {
    std::lock_guard lock(task->mutex);
    task->attempt = attempt;
  }
  attempt.state()->on_ready([&rt, task, attempt, rank, retries_left]() mutable {
    // The callback runs on the thread that handled the reply, or on this one when the
    // reply came first: either way a reference in the result binds to `rt`.
    detail::RuntimeScope scope(&rt);
    rt.task_done(rank);
    try {
      if constexpr (std::is_void_v<R>) {
        parse_task_result<R>(attempt.get());
        task->out->set_value();
      } else {
        task->out->set_value(parse_task_result<R>(attempt.get()));
      }
    } catch (const RemoteError& e) {
      if (e.code() == ErrorCode::rank_lost && retries_left > 0 && !task->out->ready()) {
        try {
          return start_task(rt, task, retries_left - 1, -1);
        } catch (...) {  // no rank left to run it
        }
      }
      task->out->set_error(std::current_exception());
    } catch (...) {
      task->out->set_error(std::current_exception());
    }
  });
}

}  // namespace detail

template <auto F, class... A>
auto Runtime::submit(A&&... args) {
  return submit<F>(TaskOptions{}, std::forward<A>(args)...);
}

template <auto F, class... A>
auto Runtime::submit(TaskOptions options, A&&... args) {
  using Traits = detail::FunctionTraits<decltype(F)>;
  using R = typename Traits::Result;
  TROUPE_CHECK(options.rank >= -1 && options.rank < size_, "submit task ", detail::TaskKey<F>::name, ": rank ",
               options.rank, " is outside the world of ", size_, " ranks");
  TROUPE_CHECK(options.retries >= 0, "submit task ", detail::TaskKey<F>::name, ": retries must be >= 0, got ",
               options.retries);
  detail::check_task(detail::TaskKey<F>::key);
  auto task = std::make_shared<detail::TaskRun<R>>();
  task->key = detail::TaskKey<F>::key;
  task->options = options;
  detail::append_serialized(task->args, typename Traits::Args(std::forward<A>(args)...));
  task->out = std::make_shared<detail::State<R>>(progress(), "task " + detail::TaskKey<F>::name);
  task->out->set_cancel_forward([weak = std::weak_ptr<detail::TaskRun<R>>(task)] {
    if (auto t = weak.lock()) {
      std::lock_guard lock(t->mutex);
      if (t->attempt.valid()) t->attempt.cancel();
    }
  });
  detail::start_task(*this, task, options.retries, options.rank);
  return Future<R>(task->out);
}

template <auto F, class Range>
auto Runtime::map(const Range& inputs, std::size_t max_in_flight) {
  return map<F>(inputs, TaskOptions{}, max_in_flight);
}

template <auto F, class Range>
auto Runtime::map(const Range& inputs, TaskOptions options, std::size_t max_in_flight) {
  using R = typename detail::FunctionTraits<decltype(F)>::Result;
  static_assert(!std::is_void_v<R>, "map: the function must return a value");
  using Input = std::decay_t<decltype(*std::begin(inputs))>;
  TROUPE_CHECK(max_in_flight >= 1, "map: max_in_flight must be >= 1");
  struct Mapping {
    std::mutex mutex;
    std::vector<Input> inputs;
    std::vector<R> results;
    std::size_t next = 0, done = 0;
    bool failed = false;
    std::shared_ptr<detail::State<std::vector<R>>> out;
    // The tasks in flight, by input, for cancel(); a finished one's is dropped at once
    // (kept, a map of 100,000 held every result's state to its end).
    std::vector<Future<R>> running;
  };
  auto m = std::make_shared<Mapping>();
  m->inputs.assign(std::begin(inputs), std::end(inputs));
  m->results.resize(m->inputs.size());
  m->running.resize(m->inputs.size());
  m->out = std::make_shared<detail::State<std::vector<R>>>(progress(), "map of task " + detail::TaskKey<F>::name);
  m->out->set_cancel_forward([weak = std::weak_ptr<Mapping>(m)] {
    auto mapping = weak.lock();
    if (!mapping) return;
    std::vector<Future<R>> running;
    {
      std::lock_guard lock(mapping->mutex);
      mapping->failed = true;  // launch no more
      for (const auto& f : mapping->running)
        if (f.valid()) running.push_back(f);
    }
    for (auto& f : running)
      if (!f.ready()) f.cancel();
  });
  if (m->inputs.empty()) {
    m->out->set_value({});
    return Future<std::vector<R>>(m->out);
  }
  // Launches input i; when it ends, records it and launches the next, so at most
  // max_in_flight run at once.
  auto launch = std::make_shared<std::function<void(std::size_t)>>();
  *launch = [this, m, options, weak_launch = std::weak_ptr<std::function<void(std::size_t)>>(launch)](std::size_t i) {
    Future<R> f = submit<F>(options, m->inputs[i]);
    {
      std::lock_guard lock(m->mutex);
      if (!f.ready()) m->running[i] = f;  // else its callback below has run already
    }
    f.state()->on_ready([m, f, i, launch = weak_launch.lock()]() mutable {
      std::optional<std::size_t> next;
      bool finished = false;
      std::exception_ptr error;
      try {
        R value = f.get();
        std::lock_guard lock(m->mutex);
        m->results[i] = std::move(value);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(m->mutex);
        m->running[i] = Future<R>();
        ++m->done;
        if (error && !m->failed) m->failed = true;
        if (!m->failed && m->next < m->inputs.size()) next = m->next++;
        finished = m->done == m->next;  // nothing in flight, nothing more to launch
      }
      if (error) return m->out->set_error(error);
      if (next) return (*launch)(*next);
      if (!finished) return;
      if (m->next < m->inputs.size())  // cancel() stopped the launches
        return m->out->set_error(std::make_exception_ptr(
            Cancelled({ErrorCode::cancelled, -1, "", m->out->what(), "", "the map was cancelled"})));
      m->out->set_value(std::move(m->results));
    });
  };
  std::size_t first = 0;
  {
    std::lock_guard lock(m->mutex);
    first = std::min(max_in_flight, m->inputs.size());
    m->next = first;
  }
  for (std::size_t i = 0; i < first; ++i) (*launch)(i);
  return Future<std::vector<R>>(m->out);
}

}  // namespace troupe::actors
