// Runtime: one per MPI rank, the node of the actor system on that rank.
//
//   troupe::Runtime rt(argc, argv);                    // MPI_Init_thread(MULTIPLE)
//   auto counter = rt.spawn<Counter>(1, 10);           // built on rank 1
//   int v = counter.ask(&Counter::add, 5).get();       // from any rank
//   counter.tell(&Counter::reset);                     // fire and forget
//   auto all = rt.spawn_on_each<Worker>(cfg);          // collective: one per rank
//   auto sums = troupe::when_all(all.ask(&Worker::step, 3)).get();
//   auto sq = rt.submit<&square>(7);                   // a task, on the least busy rank
//   f.cancel();  rt.kill(counter);  rt.actors();       // stop work; see what runs
//
// Threads per rank: `threads` pool workers run actor methods (each actor has a
// mailbox drained by one thread at a time, so one message at a time, in arrival
// order per sender, unless it declares concurrency groups: methods.hpp), plus one progress thread that receives MPI
// messages when no caller is waiting, and runs the calls of short-running actors itself. A caller waiting on a Future
// receives and dispatches messages itself while it polls (see future.hpp), and may run ready actor methods of its own
// rank meanwhile, which is also why an actor method may ask other actors and wait without deadlocking the pool.
//
// Contract: the constructor, spawn_on_each() and shutdown() (or the destructor) are
// collective: every rank calls them, in the same order. Everything else may be called
// from any thread of any rank at any time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "troupe/actors/bytes.hpp"
#include "troupe/actors/detail/actor_cell.hpp"
#include "troupe/actors/errors.hpp"
#include "troupe/actors/future.hpp"
#include "troupe/actors/methods.hpp"
#include "troupe/actors/spawn_options.hpp"
#include "troupe/trace.hpp"

namespace troupe::mpi {
class Environment;
}

namespace troupe::actors {

struct RuntimeOptions {
  // Pool threads running actor methods on each rank. One is right when ranks share
  // a few cores; more help only when one rank hosts several busy actors. 0 runs every
  // method on the rank's progress thread: no thread handoff between receiving a call
  // and running it (the lowest latency), but while a method runs, that rank receives
  // messages only through callers waiting on futures.
  int threads = 1;
  // Upper bound on how long shutdown() waits for in-flight messages to drain before
  // it fails what is left and goes on, so a stuck actor cannot hang the job's exit.
  std::chrono::milliseconds shutdown_drain_timeout{10000};
  // Each rank tells every other rank it is alive this often, from a thread of its
  // own; a rank not heard from for `liveness_timeout` is declared lost: calls waiting
  // on it fail with ErrorCode::rank_lost, and shutdown() ends the job naming it.
  // One second beats mpirun, which tears a job down 1.5-2.6 s after a rank dies.
  // TROUPE_LIVENESS_TIMEOUT_MS (troupe-run --liveness-timeout) overrides it.
  std::chrono::milliseconds heartbeat_period{100};
  std::chrono::milliseconds liveness_timeout{1000};
  // A message whose attachments travel as MPI messages of their own (above 256 KB) is
  // dropped, with a log line, when the next of them has not begun to arrive within
  // this long. Meanwhile the rank goes on receiving from other ranks; its sender's
  // later messages wait behind it, keeping per-sender order.
  std::chrono::milliseconds attachment_timeout{10000};
  // Bytes this rank's object store may hold in memory (Runtime::put, ActorRef::ask_ref).
  // Beyond it, with object_spill_folder, the oldest objects move to files there (read
  // back at each fetch); without one, or when the folder's file system is 95% full, a
  // new object is refused (ErrorCode::overloaded). TROUPE_OBJECT_SPILL_FOLDER overrides
  // the folder. See docs/TASKS_AND_OBJECTS.md#object-references.
  std::size_t object_store_limit = std::size_t{4} << 30;
  std::string object_spill_folder{};  // {}: designated initializers may leave it out quietly
};

template <class T>
class ActorRef;
template <class T>
class ActorGroup;
template <class T>
class ObjectRef;

// How Runtime::submit places a task (task.hpp).
struct TaskOptions {
  int rank = -1;    // where to run it; -1: the rank with the fewest of this rank's tasks in flight
  int retries = 0;  // runs it elsewhere after its rank was lost, at most this many times (idempotent only)
};

// One actor as Runtime::actors() lists it: a snapshot, as Ray's state API gives. A call
// is answered before its lane is marked idle and counted, so a snapshot taken just after
// an answer may still show that call running for a moment.
struct ActorInfo {
  int rank = -1;
  std::uint64_t id = 0;
  std::string type;                 // actor_name<T>(): "TrainWorker<DigitsRecipe>"
  std::string name;                 // SpawnOptions::name, or empty
  std::string label;                // how errors name it: "Counter 'c'", "Counter #3"
  std::string state;                // "alive", "restarting", "dead" or "killed"
  std::uint64_t mailbox_depth = 0;  // calls queued, not yet started
  std::string running;              // the methods running now ("a, b" with concurrency groups)
  double running_for_s = 0;         // since the longest-running of them started
  std::uint64_t calls_served = 0;   // calls run to their end (answered or failed)
  int restarts = 0;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(rank, id, type, name, label, state, mailbox_depth, running, running_for_s, calls_served, restarts);
  }
};

namespace detail {
class ObjectLedger;
class ObjectStore;
enum class Kind : std::uint8_t;  // wire.hpp
class Doorbells;
class Transport;
class PeerLiveness;
class Scheduler;
struct Message;
struct Header;

// What a pending ask does with its answer.
class ReplyHandler {
 public:
  explicit ReplyHandler(std::string what) : what_(std::move(what)) {}
  virtual ~ReplyHandler() = default;
  virtual void on_value(std::string_view bytes) = 0;
  virtual void on_error(std::exception_ptr error) = 0;
  const std::string& what() const { return what_; }

 private:
  std::string what_;
};

template <class R>
class TypedReply final : public ReplyHandler {
 public:
  // `uncounted`: the reply is a stored value (object_ref.hpp, UncountedRefsScope).
  TypedReply(std::string what, std::shared_ptr<State<R>> state, bool uncounted = false)
      : ReplyHandler(std::move(what)), state_(std::move(state)), uncounted_(uncounted) {}
  void on_value(std::string_view bytes) override {
    try {
      std::optional<UncountedRefsScope> scope;
      if (uncounted_) scope.emplace();
      if constexpr (std::is_void_v<R>) {
        parse_exactly(bytes, "reply");
        state_->set_value();
      } else {
        R value{};
        parse_exactly(bytes, "reply", value);
        state_->set_value(std::move(value));
      }
    } catch (const BadMessage& e) {
      on_error(std::make_exception_ptr(RemoteError({ErrorCode::bad_message, -1, "", what(), "BadMessage", e.what()})));
    }
  }
  void on_error(std::exception_ptr error) override { state_->set_error(std::move(error)); }

 private:
  std::shared_ptr<State<R>> state_;
  bool uncounted_;
};

using Factory = std::function<std::unique_ptr<ActorCellBase>(std::uint64_t id, SpawnOptions options, std::string args)>;
struct FactoryEntry {
  Factory make;
  std::string actor;  // actor_name<T>(), for errors
};
// Registers how to build an actor type from serialized constructor arguments; the
// key names the type and the argument types. Returns the key.
std::string register_factory(std::string key, std::string actor, Factory factory);
std::map<std::string, FactoryEntry>& factory_registry();

template <class T, class... A>
std::unique_ptr<T> make_from_bytes(std::string_view args_bytes) {
  std::tuple<A...> args;
  UncountedRefsScope uncounted;  // parsed again at each restart
  parse_exactly(args_bytes, "constructor arguments", args);
  return std::apply([](auto&... a) { return std::make_unique<T>(std::move(a)...); }, args);
}

template <class T, class... A>
std::unique_ptr<ActorCellBase> construct_from_bytes(std::uint64_t id, SpawnOptions options, std::string args) {
  return std::make_unique<ActorCell<T>>(id, std::move(options), std::move(args), &make_from_bytes<T, A...>);
}

// Every rank runs the same binary, so instantiating this (by calling spawn<T>(...))
// registers the factory in every process before main, under the same key.
template <class T, class... A>
struct SpawnKey {
  static inline const std::string key =
      register_factory(type_name<T>() + "(" + ((type_name<A>() + ",") + ... + std::string()) + ")", actor_name<T>(),
                       &construct_from_bytes<T, A...>);
};

}  // namespace detail

class Runtime : private detail::CallCanceller {
 public:
  Runtime(int& argc, char**& argv, RuntimeOptions options = {});
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  // Calls shutdown() if it has not run. During stack unwinding from an exception
  // it aborts the job instead (see shutdown), naming this rank.
  ~Runtime();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Constructs T(args...) on `rank` and waits until it exists. The arguments are
  // serialized (cereal) when the rank is another; a constructor that throws comes
  // back as RemoteError. `rank` outside the world is an InvalidArgument here.
  template <class T, class... A>
  ActorRef<T> spawn(int rank, A&&... args) {
    return spawn_with<T>(rank, SpawnOptions{}, std::forward<A>(args)...);
  }
  template <class T, class... A>
  ActorRef<T> spawn_with(int rank, SpawnOptions options, A&&... args);

  // Collective: every rank constructs one T(args...) locally. Returns when all have;
  // if any constructor threw, every rank throws the same CollectiveError naming the
  // failed ranks and what each constructor threw.
  template <class T, class... A>
  ActorGroup<T> spawn_on_each(A&&... args);

  // The actor registered under `name` (rank 0 keeps the registry).
  template <class T>
  ActorRef<T> lookup(const std::string& name);

  // Stops the actor for good, as Ray's ray.kill: calls still queued fail with
  // ActorKilled, later ones too, a method running now sees this_call::cancelled()
  // and ends as it will (it cannot be interrupted), then the object is destroyed.
  // Not restarted, whatever its SpawnOptions. Resolves once the actor's rank has
  // marked it; killing a dead actor does nothing.
  template <class T>
  Future<void> kill(const ActorRef<T>& actor) {
    return kill_actor(actor.rank(), actor.id(), detail::actor_name<T>());
  }

  // Tasks (task.hpp): the free function F run with `args` on some rank, as Ray's
  // f.remote(args); map runs it over every element of `inputs`, at most
  // `max_in_flight` at once. Any rank, any thread.
  template <auto F, class... A>
  auto submit(A&&... args);
  template <auto F, class... A>
  auto submit(TaskOptions options, A&&... args);
  template <auto F, class Range>
  auto map(const Range& inputs, std::size_t max_in_flight = 64);
  template <auto F, class Range>
  auto map(const Range& inputs, TaskOptions options, std::size_t max_in_flight = 64);

  // Object references (object_ref.hpp): `value` kept in this rank's store until
  // freed; any rank holding the ref fetches it from here.
  template <class T>
  ObjectRef<T> put(const T& value);
  // Bytes this rank's store holds in memory now, and may hold; bytes it has spilled.
  std::size_t object_store_size() const;
  std::size_t object_store_limit() const { return options_.object_store_limit; }
  std::size_t object_store_spilled() const;
  const std::string& object_spill_folder() const { return options_.object_spill_folder; }

  // Every rank's actors, in rank order (asked of each rank; a rank that was lost is
  // left out). Any rank, any time; not collective.
  std::vector<ActorInfo> actors();
  // This rank's.
  std::vector<ActorInfo> local_actors() const;

  // Collective and idempotent: waits until every rank has called it, drains messages
  // in flight, fails any future still unresolved with ErrorCode::shutdown, destroys
  // the actors and finalizes MPI (when this runtime initialised it).
  void shutdown();

  // Called from the runtime's heartbeat thread about every `period` while it runs, so
  // a supervisor can receive heartbeats. One hook; a new one replaces it.
  void set_liveness_hook(std::function<void()> hook, std::chrono::milliseconds period);
  // Timeline spans (troupe/trace.hpp): every actor call this rank runs while `tracer`
  // records, on the thread that runs it ("TrainWorker (group 1).train_epoch"). Shared,
  // so a call in progress keeps the tracer alive; null stops.
  void set_tracer(std::shared_ptr<Tracer> tracer);
  // Liveness messages (ring heartbeats and loss notices) this rank has sent: about one
  // per heartbeat period, whatever the number of ranks.
  std::uint64_t liveness_messages_sent() const;
  // CPU time the liveness thread has used so far (its cost, for the same benchmark).
  std::chrono::nanoseconds liveness_cpu_time() const;
  // Tells refused so far by this rank's actors, their mailbox being full
  // (SpawnOptions::mailbox_capacity), whichever rank sent them.
  std::uint64_t refused_tells() const;

  // ---- used by ActorRef and the templates above; not for application code ----
  // Sends an ask; returns its request id. `deadline`: when it must have started by.
  // With `keep_result` the callee keeps the result in its object store and answers
  // with its ObjectRef (ActorRef::ask_ref).
  std::uint64_t send_request(int rank, std::uint64_t actor, std::uint32_t method, std::string payload,
                             std::shared_ptr<detail::ReplyHandler> reply, std::vector<Bytes> attachments = {},
                             std::optional<Clock::time_point> deadline = std::nullopt, bool keep_result = false);
  // The object store (object_store.hpp). store_object returns the new object's id, or
  // throws RemoteError (overloaded) when it neither fits nor can be spilled;
  // stored_object copies the bytes out (the attachments are shared, or read back from
  // a spill file) or throws (unknown object, storage_failed).
  std::uint64_t store_object(std::string bytes, std::vector<Bytes> attachments);
  std::pair<std::string, std::vector<Bytes>> stored_object(std::uint64_t id) const;
  template <class T>
  Future<T> fetch_object(int rank, std::uint64_t id);
  void request_object(int rank, std::uint64_t id, std::shared_ptr<detail::ReplyHandler> reply);
  void free_object(int rank, std::uint64_t id);
  // Gives `weight` of the object's references back to its owner (ObjectHandle); the
  // owner frees the object when all its weight has come back.
  void release_object(int rank, std::uint64_t id, std::uint64_t weight);
  const std::shared_ptr<detail::ObjectLedger>& object_ledger() const { return object_ledger_; }
  // A request id for an ask to an actor of this rank (remote asks get theirs in
  // send_request), so that it can be cancelled like any other.
  std::uint64_t new_request_id() { return next_request_id_.fetch_add(1, std::memory_order_relaxed); }
  detail::CallCanceller* canceller() { return this; }
  // Task placement (tasks.cpp): the rank a task goes to, counted in flight until
  // task_done; the id of the task runner on `rank` (made on every rank at first use).
  int place_task(int requested);
  void task_done(int rank);
  std::uint64_t task_runner(int rank);
  void send_tell(int rank, std::uint64_t actor, std::uint32_t method, std::string payload,
                 std::vector<Bytes> attachments = {});
  // Sends `bytes` as an actor message exactly as given: for tests of the wire format.
  void send_raw(int rank, const std::string& bytes);
  // The local actor with this id, or null.
  std::shared_ptr<detail::ActorCellBase> local_actor(std::uint64_t id) const;
  // Queues one call (detail::make_call(method, body, fail)) in the actor's mailbox,
  // to run under supervision: a dead actor, a call made stale by a restart, or an
  // exception from `body` ends in `fail` (a FatalError also restarts the actor, or
  // kills it past its limit).
  void post_call(const std::shared_ptr<detail::ActorCellBase>& cell, std::unique_ptr<detail::Call> call);
  // How a failed tell is reported: nobody waits for it, so on this rank's stderr.
  void report_failed_tell(int source, const ErrorInfo& info) const;
  detail::Progress* progress() const;
  // The header's room at the start of every outgoing message.
  static std::string new_message();

 private:
  struct NameEntry {
    int rank;
    std::uint64_t id;
    std::string type;
  };
  std::uint64_t spawn_bytes(int rank, const std::string& key, const SpawnOptions& options, const std::string& args);
  std::unique_ptr<detail::ActorCellBase> build(const std::string& key, std::uint64_t id, const SpawnOptions& options,
                                               const std::string& args);
  std::uint64_t spawn_local(const std::string& key, const SpawnOptions& options, const std::string& args);
  // Runs one call taken from one of the actor's lanes (the scheduler calls it).
  void execute(detail::Lane& lane, std::unique_ptr<detail::Call> call);
  // In the actor's call after `body` threw FatalError: re-create it or declare it dead.
  void restart_or_bury(detail::ActorCellBase& cell);
  // Runs `replace` (a restart or a kill's destruction) on the thread running a call of
  // lane `own`: for an actor with concurrency groups, first stops the other lanes from
  // starting calls and waits until none runs one.
  void replace_object(detail::ActorCellBase& cell, detail::Lane& own, const std::function<void()>& replace);
  std::uint64_t spawn_group_local(const std::string& key, const std::string& args);
  // ---- cancellation (cancellation.cpp) ----
  void cancel_call(const detail::CallHandle& call, detail::StateBase& state) override;
  // A cancel message from `source` for its ask `request` to actor `actor`.
  void handle_cancel(int source, std::uint64_t actor, std::uint64_t request);
  Future<void> kill_actor(int rank, std::uint64_t id, const std::string& type);
  void kill_local(std::uint64_t id, int by);
  // In a call of a killed actor, on the thread that owns lane `own`: destroy the
  // object once, when no other lane runs a call.
  void bury_if_killed(detail::ActorCellBase& cell, detail::Lane& own);
  // ---- live state (live_state.cpp) ----
  // With TROUPE_STATUS_DIR set (troupe-run sets it), a thread writes this rank's
  // actors there as rank-<r>.json about once a second, for `troupe-run status`.
  void start_status_writer();
  void stop_status_writer();
  void write_status(bool finished) const;
  // Collective: every rank's `mine`, in rank order.
  std::vector<std::string> allgather_texts(const std::string& mine, const char* what);
  NameEntry lookup_entry(const std::string& name);
  void register_name(const std::string& name, int rank, std::uint64_t id, const std::string& type);
  void handle(detail::Message message);  // called by the transport, in arrival order
  void handle_request(detail::Message& message, bool wants_reply, bool keep_result = false);
  void handle_fetch(int source, std::uint64_t request, std::uint64_t id);
  void handle_system(detail::Message& message);
  // Returns the request id (0 when the rank was lost and `reply` failed at once).
  std::uint64_t send_with_reply(int rank, detail::Header header, std::string payload,
                                std::shared_ptr<detail::ReplyHandler> reply, std::vector<Bytes> attachments = {});
  // Sends a runtime request to `rank` and waits for its reply, driving progress.
  template <class R>
  R system_call(int rank, detail::Header header, std::string payload, const std::string& what);
  void reply_error(int rank, std::uint64_t request, const ErrorInfo& info);
  // Replies once a method's returned Future resolves (with its ObjectRef, kept here,
  // for `keep_result`).
  void reply_later(int rank, std::uint64_t request, std::shared_ptr<detail::DeferredAnswer> later, std::string actor,
                   std::string method, bool keep_result);
  // Keeps a call's serialized result (after its header) and replies with its ObjectRef.
  void reply_kept(int rank, std::uint64_t request, std::string result, std::vector<Bytes> attachments);
  // A free_object or release_object message to the object's owner `rank`.
  void tell_owner(int rank, detail::Kind kind, std::uint64_t id, std::uint64_t weight);
  void reply_value(int rank, std::uint64_t request, std::string bytes, const std::vector<Bytes>& attachments = {});
  void install_actor(std::shared_ptr<detail::ActorCellBase> cell);
  void wait_collective(void* request, const char* what);
  void drain();
  void on_rank_lost(int rank, const std::string& reason);
  [[noreturn]] void abort_for_lost_ranks(const char* during);
  void fail_pending(ErrorCode code, const std::string& why);
  std::shared_ptr<detail::ReplyHandler> take_pending(std::uint64_t request);

  RuntimeOptions options_;
  std::unique_ptr<mpi::Environment> environment_;
  int rank_ = 0, size_ = 1;
  void* actor_comm_ = nullptr;   // MPI_Comm, kept opaque so this header needs no mpi.h
  void* system_comm_ = nullptr;  // for the runtime's own collectives
  std::unique_ptr<detail::Scheduler> scheduler_;
  std::unique_ptr<detail::PeerLiveness> liveness_;
  std::unique_ptr<detail::Doorbells> doorbells_;  // the transport's, outliving it
  std::unique_ptr<detail::Transport> transport_;

  mutable std::shared_mutex actors_mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<detail::ActorCellBase>> actors_;
  std::atomic<std::uint64_t> next_actor_id_{1};
  std::uint64_t next_group_id_ = 1;

  std::mutex pending_mutex_;
  struct Pending {
    int rank;
    std::shared_ptr<detail::ReplyHandler> reply;
  };
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::atomic<std::uint64_t> next_request_id_{1};
  detail::SplitCount queued_calls_;                      // calls and spawns posted, not yet finished
  mutable std::atomic<std::uint64_t> refused_tells_{0};  // counted where they are reported
  // Counts a queued call or spawn down; wakes shutdown's drain at zero.
  void call_finished();
  std::mutex drain_mutex_;
  std::condition_variable drain_cv_;
  std::atomic<bool> draining_{false};

  std::mutex names_mutex_;  // rank 0 only: the job's name registry
  std::unordered_map<std::string, NameEntry> names_;

  bool shut_down_ = false;
  std::atomic<bool> quiescent_{false};  // set once shutdown's drain has completed

  // A restart's backoff (SpawnOptions::backoff) waits on this, not in a sleep, so that
  // shutdown() ends every pause at once.
  std::mutex backoff_mutex_;
  std::condition_variable backoff_cv_;
  bool backoffs_ended_ = false;

  std::unique_ptr<detail::ObjectStore> objects_;  // object_store.hpp
  std::shared_ptr<detail::ObjectLedger> object_ledger_;

  std::mutex tasks_mutex_;
  std::vector<int> tasks_in_flight_;  // by rank, this rank's tasks only
  std::mutex task_runners_mutex_;
  std::vector<std::uint64_t> task_runners_;  // by rank; 0: none (the rank was lost)
  int next_task_rank_ = 0;

  std::string status_dir_;            // TROUPE_STATUS_DIR; empty: no status files
  std::atomic<bool> tracing_{false};  // tracer_ is set: only then is tracer_mutex_ taken per call
  std::mutex tracer_mutex_;
  std::shared_ptr<Tracer> tracer_;
  std::thread status_thread_;
  std::mutex status_mutex_;
  std::condition_variable status_cv_;
  bool status_stop_ = false;
};

}  // namespace troupe::actors

#include "troupe/actors/actor_ref.hpp"

namespace troupe {
using actors::ActorDead;
using actors::ActorGroup;
using actors::ActorInfo;
using actors::ActorKilled;
using actors::ActorRef;
using actors::ActorRestarted;
using actors::Cancelled;
using actors::CollectiveError;
using actors::DeadlineExceeded;
using actors::FatalError;
using actors::print_error;
using actors::RemoteError;
using actors::Runtime;
using actors::RuntimeOptions;
using actors::SpawnOptions;
using actors::TaskOptions;
}  // namespace troupe
