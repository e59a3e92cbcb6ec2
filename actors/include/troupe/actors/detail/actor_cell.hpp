// An actor as the runtime holds it: the user's object, its name, type and
// supervision state, and the table that turns (method index, argument bytes) into a
// call. Calls reach the object through lanes: a lane is a mailbox whose single owner
// runs its calls one at a time, in order (mailbox.hpp). An actor has one lane for
// its default group and one per unit of size of its concurrency groups (methods.hpp),
// so calls of different groups may run at once; a restart or a kill's destruction
// waits until the other lanes are idle, so no call ever sees a half-built object.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/actors/detail/mailbox.hpp"
#include "troupe/actors/detail/serialization.hpp"
#include "troupe/actors/detail/split_count.hpp"
#include "troupe/actors/future.hpp"
#include "troupe/actors/methods.hpp"
#include "troupe/actors/spawn_options.hpp"

namespace troupe::actors::detail {

class ActorCellBase;

// One lane of an actor: its mailbox, and what runs there now.
class Lane {
 public:
  static constexpr std::uint32_t kIdle = ~std::uint32_t{0};
  // A call never seen counts as one second long: a burst of first calls spreads.
  static constexpr std::int64_t kUnknownCall = std::chrono::steady_clock::duration(std::chrono::seconds(1)).count();
  explicit Lane(ActorCellBase& cell) : cell_(cell) {}
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;
  ActorCellBase& cell() const { return cell_; }
  Mailbox& mailbox() { return mailbox_; }
  // Whether its last call was short enough to run on the thread that received it
  // (see scheduler.hpp).
  bool fast() const { return fast_.load(std::memory_order_relaxed); }
  void set_fast(bool fast) {  // stored only when it changes: senders read its line
    if (fast_.load(std::memory_order_relaxed) != fast) fast_.store(fast, std::memory_order_relaxed);
  }
  // One of several lanes of a concurrency group. These count their calls and time
  // them, so that a call goes to a lane that will run it soon (Scheduler::lane_for).
  bool grouped() const { return grouped_; }
  void set_grouped() {  // before the actor is shared
    grouped_ = true;
    last_call_ticks_.store(kUnknownCall, std::memory_order_relaxed);
  }
  void count_posted() { posted_.fetch_add(1, std::memory_order_relaxed); }
  void count_taken() { taken_.store(taken_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // Calls posted and not yet done (queued or running; a redeal's calls leave at once);
  // never below the true count (taken is read first, and nothing is taken before it
  // was posted).
  std::int64_t backlog() const {
    const std::uint64_t taken = taken_.load(std::memory_order_acquire);
    return static_cast<std::int64_t>(posted_.load(std::memory_order_acquire) - taken);
  }
  // steady_clock ticks the last call took, at most kUnknownCall (a product with the
  // backlog must not overflow).
  std::int64_t last_call_ticks() const { return last_call_ticks_.load(std::memory_order_relaxed); }
  void set_last_call(std::int64_t ticks) {
    last_call_ticks_.store(std::min(ticks, kUnknownCall), std::memory_order_relaxed);
  }

 private:
  ActorCellBase& cell_;
  bool grouped_ = false;
  std::atomic<bool> fast_{true};
  std::atomic<std::uint64_t> posted_{0};  // the senders' line
  Mailbox mailbox_;                       // on cache lines of its own (mailbox.hpp)

 public:
  // Live state, written by the running call, read from any thread: on a line of its
  // own, as the runner writes it on every call.
  alignas(kApart) std::atomic<std::uint32_t> running_method_{kIdle};
  std::atomic<std::int64_t> running_since_ticks_{0};  // steady_clock ticks

 private:
  std::atomic<std::uint64_t> taken_{0};  // written by the lane's owner only
  std::atomic<std::int64_t> last_call_ticks_{0};
};

// Where each method's calls go: lanes [first, first + count) of the actor.
struct LaneRange {
  std::uint32_t first = 0;
  std::uint32_t count = 1;
};
struct LaneLayout {
  std::uint32_t lanes = 1;
  std::vector<LaneRange> methods;  // by method index
};

// The answer of a method that returned a Future: the runtime replies once it resolves.
class DeferredAnswer {
 public:
  virtual ~DeferredAnswer() = default;
  // Runs `callback` once resolved, on the thread that resolves it (at once if it is).
  virtual void on_ready(std::function<void()> callback) = 0;
  // Appends the serialized value, or throws the future's error.
  virtual void append(std::string& out) = 0;
};

template <class X>
class FutureAnswer final : public DeferredAnswer {
 public:
  explicit FutureAnswer(Future<X> future) : future_(std::move(future)) {}
  void on_ready(std::function<void()> callback) override { future_.state()->on_ready(std::move(callback)); }
  void append(std::string& out) override {
    if constexpr (std::is_void_v<X>)
      future_.get();
    else
      append_serialized(out, future_.get());
  }

 private:
  Future<X> future_;
};

class ActorCellBase {
 public:
  ActorCellBase(std::uint64_t id, SpawnOptions options, std::string constructor_args, std::string type,
                std::string type_label, std::vector<std::string> methods, std::vector<bool> idempotent,
                LaneLayout layout)
      : id_(id),
        options_(std::move(options)),
        constructor_args_(std::move(constructor_args)),
        type_(std::move(type)),
        type_label_(std::move(type_label)),
        method_names_(std::move(methods)),
        idempotent_(std::move(idempotent)),
        layout_(std::move(layout)) {
    for (std::uint32_t i = 0; i < layout_.lanes; ++i) lanes_.emplace_back(*this);
    for (const LaneRange& range : layout_.methods)
      if (range.count > 1)
        for (std::uint32_t i = range.first; i < range.first + range.count; ++i) lanes_[i].set_grouped();
  }
  virtual ~ActorCellBase() = default;

  // Deserializes the arguments of method `index` from `args`, calls it, and appends
  // the serialized result to `result` -- or, for a method that returns a Future, returns
  // the answer to wait for. Throws BadMessage for bytes that don't parse.
  virtual std::shared_ptr<DeferredAnswer> invoke(std::uint32_t index, std::string_view args, std::string& result) = 0;
  virtual void* object() = 0;
  // Replaces the object with a new one built from the original constructor
  // arguments, then calls its on_restart(count) if it has one. Runs as the actor's
  // current call.
  virtual void rebuild(int restart_count) = 0;
  // Destroys the object (a dead actor holds no resources).
  virtual void bury() = 0;

  std::uint64_t id() const { return id_; }
  const std::string& name() const { return options_.name; }
  const std::string& type() const { return type_; }
  const std::string& type_label() const { return type_label_; }  // actor_name<T>()
  const SpawnOptions& options() const { return options_; }
  const std::string& constructor_args() const { return constructor_args_; }
  // "Counter 'name'" or "Counter #3": how errors name this actor (actor_name<T>()).
  // Ids of spawn_on_each groups have the top bit set; "(group 1)" reads better.
  std::string label() const {
    if (!name().empty()) return type_label_ + " '" + name() + "'";
    if (id_ >> 63) return type_label_ + " (group " + std::to_string(id_ & ~(std::uint64_t{1} << 63)) + ")";
    return type_label_ + " #" + std::to_string(id_);
  }
  // The bare name ("add"): errors name the actor beside it.
  std::string method_name(std::uint32_t index) const {
    return index < method_names_.size() ? unqualified(method_names_[index]) : "method #" + std::to_string(index);
  }
  std::size_t method_count() const { return method_names_.size(); }
  bool idempotent(std::uint32_t index) const { return index < idempotent_.size() && idempotent_[index]; }
  // Its asks, queued or running, for cancellation.
  CallRegistry& calls() { return calls_; }
  std::size_t lane_count() const { return lanes_.size(); }
  Lane& lane(std::size_t i) { return lanes_[i]; }
  const Lane& lane(std::size_t i) const { return lanes_[i]; }
  // The lanes a call of `method` may go to (the default lane for an unknown index,
  // whose call then fails); Scheduler::lane_for picks one.
  LaneRange lanes_of(std::uint32_t method) const {
    return method < layout_.methods.size() ? layout_.methods[method] : LaneRange{};
  }
  std::uint32_t next_lane() { return next_lane_.fetch_add(1, std::memory_order_relaxed); }
  // Whether calls of this actor may run at once (it has concurrency groups).
  bool concurrent() const { return lanes_.size() > 1; }
  // For concurrent actors: set while a restart or a kill replaces or destroys the
  // object (one at a time, under replace_mutex_); no lane starts a call meanwhile.
  std::atomic<bool> replacing_{false};
  std::mutex replace_mutex_;
  // Signals the replacer when a lane goes idle, and the lanes when the replacement is
  // done (with gate_mutex_, not replace_mutex_, which the replacer holds throughout).
  std::mutex gate_mutex_;
  std::condition_variable gate_cv_;

  // ---- supervision state: written by the actor's running call, read from any thread ----
  int epoch() const { return epoch_.load(); }  // restarts so far
  bool dead() const { return dead_.load(); }
  bool restarting() const { return restarting_.load(); }
  std::atomic<int> epoch_{0};
  std::atomic<bool> dead_{false};
  std::atomic<bool> restarting_{false};
  std::atomic<int> killed_by_{-1};  // the rank whose Runtime::kill stopped it; -1: none
  std::atomic<bool> buried_{false};
  std::atomic<std::int64_t> last_restart_ticks_{0};             // steady_clock ticks of the last failure
  std::deque<std::chrono::steady_clock::time_point> failures_;  // within the window; by its calls only
  SplitCount queued_;                                           // calls posted, not yet run

  // ---- live state, for Runtime::actors() ----
  static constexpr std::uint32_t kIdle = Lane::kIdle;
  alignas(kApart) std::atomic<std::uint64_t> calls_served_{0};  // the runners' line, not the senders'

 private:
  alignas(kApart) std::uint64_t id_;  // read by every sender: away from calls_served_
  SpawnOptions options_;
  std::string constructor_args_;
  std::string type_;  // the demangled C++ type: lookup() checks it
  std::string type_label_;
  std::vector<std::string> method_names_;
  std::vector<bool> idempotent_;
  LaneLayout layout_;
  CallRegistry calls_;      // before lanes_: the calls their mailboxes destroy unlist themselves
  std::deque<Lane> lanes_;  // a deque: lanes neither move nor copy
  std::atomic<std::uint32_t> next_lane_{0};
};

// Calls method M with arguments parsed from `args_bytes`; appends its serialized result
// to `result`, or returns the answer to wait for when M returns a Future.
template <class T, auto M>
std::shared_ptr<DeferredAnswer> invoke_serialized(T& self, std::string_view args_bytes, std::string& result) {
  using Traits = MemberTraits<decltype(M)>;
  using Result = typename Traits::Result;
  typename Traits::Args args;
  parse_exactly(args_bytes, "arguments", args);
  if constexpr (std::is_void_v<Result>) {
    std::apply([&](auto&... a) { (self.*M)(std::move(a)...); }, args);
  } else if constexpr (is_future_v<Result>) {
    Result later = std::apply([&](auto&... a) { return (self.*M)(std::move(a)...); }, args);
    TROUPE_CHECK(later.valid(), "a method returned an empty Future");
    return std::make_shared<FutureAnswer<answer_t<Result>>>(std::move(later));
  } else {
    append_serialized(result, std::apply([&](auto&... a) { return (self.*M)(std::move(a)...); }, args));
  }
  return nullptr;
}

// Which of T's methods are in `listed` (a troupe::methods<...> list), by index.
template <class T, auto... Ms>
std::vector<bool> method_mask(MethodTable<Ms...>) {
  std::vector<bool> mask(method_table_t<T>::size, false);
  ((mask.at(checked_method_index<T>(Ms)) = true), ...);
  return mask;
}

// T::troupe_idempotent: re-delivered after a restart (all false without one).
template <class T>
std::vector<bool> idempotent_mask() {
  if constexpr (requires { T::troupe_idempotent; })
    return method_mask<T>(std::remove_cv_t<decltype(T::troupe_idempotent)>{});
  else
    return std::vector<bool>(method_table_t<T>::size, false);
}

// T::troupe_collective: methods that take part in collectives, so cancel() and
// deadlines refuse them (a collective cannot be left on one rank).
template <class T>
bool is_collective(std::uint32_t index) {
  static const std::vector<bool> mask = [] {
    if constexpr (requires { T::troupe_collective; })
      return method_mask<T>(std::remove_cv_t<decltype(T::troupe_collective)>{});
    else
      return std::vector<bool>(method_table_t<T>::size, false);
  }();
  return mask[index];
}

// T::troupe_concurrency as lanes: the default group first, then each group's.
template <class T>
LaneLayout lane_layout() {
  LaneLayout layout;
  layout.methods.assign(method_table_t<T>::size, LaneRange{});
  if constexpr (requires { T::troupe_concurrency; }) {
    std::vector<bool> grouped(method_table_t<T>::size, false);
    std::apply(
        [&](const auto&... groups) {
          auto add = [&](const auto& group) {
            const LaneRange range{layout.lanes, static_cast<std::uint32_t>(group.size)};
            layout.lanes += range.count;
            const std::vector<bool> mask = method_mask<T>(typename std::decay_t<decltype(group)>::Table{});
            for (std::size_t i = 0; i < mask.size(); ++i) {
              if (!mask[i]) continue;
              TROUPE_CHECK(!grouped[i], actor_name<T>(), "::troupe_concurrency: method ",
                           method_names<T>(method_table_t<T>{})[i], " is in more than one concurrency group");
              grouped[i] = true;
              layout.methods[i] = range;
            }
          };
          (add(groups), ...);
        },
        T::troupe_concurrency);
  }
  return layout;
}

template <class T>
class ActorCell final : public ActorCellBase {
 public:
  using Make = std::unique_ptr<T> (*)(std::string_view constructor_args);

  ActorCell(std::uint64_t id, SpawnOptions options, std::string args, Make make)
      : ActorCellBase(id, std::move(options), std::move(args), type_name<T>(), actor_name<T>(),
                      method_names<T>(method_table_t<T>{}), idempotent_mask<T>(), lane_layout<T>()),
        make_(make),
        object_(make_(constructor_args())) {}

  std::shared_ptr<DeferredAnswer> invoke(std::uint32_t index, std::string_view args, std::string& result) override {
    if (index >= kInvokers.size())
      throw BadMessage(concat("method index ", index, " is not in ", label(), "'s table of ", kInvokers.size()));
    return kInvokers[index](*object_, args, result);
  }
  void* object() override { return object_.get(); }
  void rebuild(int restart_count) override {
    object_.reset();  // the old state is broken: release it before building the new one
    object_ = make_(constructor_args());
    if constexpr (requires(T & t) { t.on_restart(restart_count); }) object_->on_restart(restart_count);
  }
  void bury() override { object_.reset(); }

 private:
  using Invoker = std::shared_ptr<DeferredAnswer> (*)(T&, std::string_view, std::string&);
  template <auto... Ms>
  static constexpr std::array<Invoker, sizeof...(Ms)> make_invokers(MethodTable<Ms...>) {
    return {&invoke_serialized<T, Ms>...};
  }
  static constexpr auto kInvokers = make_invokers(method_table_t<T>{});

  Make make_;
  std::unique_ptr<T> object_;
};

}  // namespace troupe::actors::detail
