// ActorRef<T>: a typed handle to an actor on any rank. Copyable, cheap, valid on the
// rank that made it (it points at that rank's Runtime).
//
// ask() returns a Future of the method's result; tell() returns nothing and a
// failure in the method is reported on the actor's rank (stderr), as nobody waits
// for it. Arguments are converted to the method's parameter types here, on the
// caller's thread, and serialized with cereal when the actor lives on another rank;
// on the same rank they are moved into the call without serialization.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "troupe/actors/runtime.hpp"

namespace troupe::actors {

template <class T>
class ActorRef {
 public:
  ActorRef() = default;
  ActorRef(Runtime* runtime, int rank, std::uint64_t id) : runtime_(runtime), rank_(rank), id_(id) {}

  int rank() const { return rank_; }
  std::uint64_t id() const { return id_; }
  bool valid() const { return runtime_ != nullptr; }

  template <class M, class... A>
  Future<answer_t<typename MemberTraits<M>::Result>> ask(
      M method, A&&... args) const requires std::is_member_function_pointer_v<M> {
    return ask_by(std::nullopt, method, std::forward<A>(args)...);
  }
  // An ask whose result stays on the actor's rank (object_ref.hpp): the future holds
  // a reference to it, for whoever needs the value to fetch.
  template <class M, class... A>
  Future<ObjectRef<answer_t<typename MemberTraits<M>::Result>>> ask_ref(M method, A&&... args) const;
  // An ask that must start by `deadline` (see Deadline in future.hpp).
  template <class M, class... A>
  Future<answer_t<typename MemberTraits<M>::Result>> ask(Deadline deadline, M method, A&&... args) const {
    return ask_by(deadline.at, method, std::forward<A>(args)...);
  }

  template <class M, class... A>
  void tell(M method, A&&... args) const {
    const std::uint32_t index = detail::checked_method_index<T>(method);
    typename MemberTraits<M>::Args packed(std::forward<A>(args)...);
    if (rank_ == runtime().rank()) {  // as a local ask: moved into the call, not serialized
      auto cell = runtime().local_actor(id_);
      if (!cell)
        return runtime().report_failed_tell(
            rank_,
            {ErrorCode::unknown_actor, rank_, detail::actor_name<T>() + " #" + std::to_string(id_),
             detail::unqualified(method_name(index)), "", "no such actor on this rank (never spawned, or stopped)"});
      runtime().post_call(cell, detail::make_call(
                                    index,
                                    [cell = cell.get(), method, packed = std::move(packed)]() mutable {
                                      T& self = *static_cast<T*>(cell->object());
                                      std::apply([&](auto&... a) { (void)(self.*method)(std::move(a)...); }, packed);
                                    },
                                    [runtime = runtime_, rank = rank_](const ErrorInfo& info) {
                                      runtime->report_failed_tell(rank, info);
                                    }));
      return;
    }
    std::string message = Runtime::new_message();
    std::vector<Bytes> attachments;
    {
      detail::AttachmentScope scope(detail::outgoing_attachments(), &attachments);
      detail::append_serialized(message, packed);
    }
    runtime().send_tell(rank_, id_, index, std::move(message), std::move(attachments));
  }

 private:
  Runtime& runtime() const {
    TROUPE_CHECK(runtime_ != nullptr, "ActorRef: this reference is empty (default-constructed)");
    return *runtime_;
  }

  template <class M, class... A>
  Future<answer_t<typename MemberTraits<M>::Result>> ask_by(std::optional<Clock::time_point> deadline, M method,
                                                            A&&... args) const {
    using Result = typename MemberTraits<M>::Result;
    using R = answer_t<Result>;  // a method returning Future<X> answers X, later
    const std::uint32_t index = detail::checked_method_index<T>(method);
    const bool collective = detail::is_collective<T>(index);
    if (deadline && collective)
      TROUPE_THROW(InvalidArgument, describe("ask", index),
                   ": a deadline on a method listed in troupe_collective is refused (it could expire on one rank "
                   "and leave the others waiting in the collective)");
    typename MemberTraits<M>::Args packed(std::forward<A>(args)...);
    auto state = std::make_shared<detail::State<R>>(runtime().progress(), describe("ask", index));
    if (rank_ == runtime().rank()) {
      auto cell = runtime().local_actor(id_);
      if (!cell) {
        state->set_error(std::make_exception_ptr(RemoteError(
            {ErrorCode::unknown_actor, rank_, detail::actor_name<T>() + " #" + std::to_string(id_),
             detail::unqualified(method_name(index)), "", "no such actor on this rank (never spawned, or stopped)"})));
        return Future<R>(state);
      }
      auto call = detail::make_call(
          index,
          [cell = cell.get(), state, method, packed = std::move(packed)]() mutable {
            T& self = *static_cast<T*>(cell->object());
            if constexpr (is_future_v<Result>) {
              Result later = std::apply([&](auto&... a) { return (self.*method)(std::move(a)...); }, packed);
              TROUPE_CHECK(later.valid(), "a method returned an empty Future");
              later.state()->on_ready([state, later]() mutable {
                try {
                  if constexpr (std::is_void_v<R>) {
                    later.get();
                    state->set_value();
                  } else {
                    state->set_value(later.get());
                  }
                } catch (...) {
                  state->set_error(std::current_exception());
                }
              });
            } else if constexpr (std::is_void_v<R>) {
              std::apply([&](auto&... a) { (self.*method)(std::move(a)...); }, packed);
              state->set_value();
            } else {
              state->set_value(std::apply([&](auto&... a) { return (self.*method)(std::move(a)...); }, packed));
            }
          },
          [state](const ErrorInfo& info) { state->set_error(remote_error(info)); });
      const std::uint64_t request = runtime().new_request_id();
      call->set_request(rank_, request);
      if (deadline) call->set_deadline(deadline->time_since_epoch().count());
      state->set_call({runtime().canceller(), rank_, id_, request, collective}, deadline);
      runtime().post_call(cell, std::move(call));
    } else {
      std::string message = Runtime::new_message();
      std::vector<Bytes> attachments;
      {
        detail::AttachmentScope scope(detail::outgoing_attachments(), &attachments);
        detail::append_serialized(message, packed);
      }
      // The reply handler shares the state, so the handle is set after the send; only
      // the future's holder reads it, and it has not got the future yet.
      const std::uint64_t request = runtime().send_request(
          rank_, id_, index, std::move(message), std::make_shared<detail::TypedReply<R>>(state->what(), state),
          std::move(attachments), deadline);
      state->set_call({runtime().canceller(), rank_, id_, request, collective}, deadline);
    }
    return Future<R>(state);
  }
  static const std::string& method_name(std::uint32_t index) {
    static const std::vector<std::string> names = detail::method_names<T>(method_table_t<T>{});
    return names[index];
  }
  // Built with plain appends: it runs for every ask, and a std::ostringstream costs
  // several times more.
  std::string describe(const char* verb, std::uint32_t index) const {
    std::string text(verb);
    text += ' ';
    text += method_name(index);
    text += " on rank ";
    text += std::to_string(rank_);
    return text;
  }

  Runtime* runtime_ = nullptr;
  int rank_ = -1;
  std::uint64_t id_ = 0;
};

namespace detail {
// The runtime whose message is being handled on this thread, so that an ActorRef
// arriving inside a message can be bound to it. Set by the runtime around message
// handling, actor calls and construction.
Runtime*& current_runtime();
class RuntimeScope {
 public:
  explicit RuntimeScope(Runtime* runtime) : previous_(current_runtime()) { current_runtime() = runtime; }
  ~RuntimeScope() { current_runtime() = previous_; }
  RuntimeScope(const RuntimeScope&) = delete;
  RuntimeScope& operator=(const RuntimeScope&) = delete;

 private:
  Runtime* previous_;
};
// The runtime a reference arriving in a message binds to (ActorRef, ObjectRef).
inline Runtime& receiving_runtime(const char* what) {
  Runtime* runtime = current_runtime();
  if (runtime == nullptr)
    throw BadMessage(concat("an ", what, " was deserialized outside the runtime's message handling"));
  return *runtime;
}
}  // namespace detail

// An ActorRef travels as (rank, id) and is bound to the receiving rank's runtime.
template <class Archive, class T>
void save(Archive& archive, const ActorRef<T>& ref) {
  archive(ref.rank(), ref.id());
}
template <class Archive, class T>
void load(Archive& archive, ActorRef<T>& ref) {
  int rank = -1;
  std::uint64_t id = 0;
  archive(rank, id);
  ref = ActorRef<T>(&detail::receiving_runtime("ActorRef"), rank, id);
}

// One actor of type T per rank, as spawn_on_each returns it.
template <class T>
class ActorGroup {
 public:
  explicit ActorGroup(std::vector<ActorRef<T>> refs) : refs_(std::move(refs)) {}
  std::size_t size() const { return refs_.size(); }
  const ActorRef<T>& operator[](std::size_t rank) const { return refs_.at(rank); }
  auto begin() const { return refs_.begin(); }
  auto end() const { return refs_.end(); }

  // The same call on every member; the futures are in rank order.
  template <class M, class... A>
  std::vector<Future<answer_t<typename MemberTraits<M>::Result>>> ask(M method, const A&... args) const {
    std::vector<Future<answer_t<typename MemberTraits<M>::Result>>> out;
    out.reserve(refs_.size());
    for (const auto& ref : refs_) out.push_back(ref.ask(method, args...));
    return out;
  }
  template <class M, class... A>
  void tell(M method, const A&... args) const {
    for (const auto& ref : refs_) ref.tell(method, args...);
  }

 private:
  std::vector<ActorRef<T>> refs_;
};

// ---- Runtime's templates ----

template <class T, class... A>
ActorRef<T> Runtime::spawn_with(int rank, SpawnOptions options, A&&... args) {
  TROUPE_CHECK(rank >= 0 && rank < size_, "spawn<", detail::actor_name<T>(), ">: rank ", rank,
               " is outside the world of ", size_, " ranks");
  const std::string& key = detail::SpawnKey<T, std::decay_t<A>...>::key;
  std::string bytes;
  detail::append_serialized(bytes, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...));
  return ActorRef<T>(this, rank, spawn_bytes(rank, key, options, bytes));
}

template <class T, class... A>
ActorGroup<T> Runtime::spawn_on_each(A&&... args) {
  const std::string& key = detail::SpawnKey<T, std::decay_t<A>...>::key;
  std::string bytes;
  detail::append_serialized(bytes, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...));
  const std::uint64_t id = spawn_group_local(key, bytes);
  std::vector<ActorRef<T>> refs;
  for (int r = 0; r < size_; ++r) refs.emplace_back(this, r, id);
  return ActorGroup<T>(std::move(refs));
}

template <class T>
ActorRef<T> Runtime::lookup(const std::string& name) {
  const NameEntry entry = lookup_entry(name);
  TROUPE_CHECK(entry.type == detail::type_name<T>(), "lookup: '", name, "' is a ", entry.type, ", not a ",
               detail::type_name<T>());
  return ActorRef<T>(this, entry.rank, entry.id);
}

}  // namespace troupe::actors

// Runtime::submit and map, ObjectRef and ask_ref, which need ActorRef whole.
#include "troupe/actors/object_ref.hpp"
#include "troupe/actors/task.hpp"
