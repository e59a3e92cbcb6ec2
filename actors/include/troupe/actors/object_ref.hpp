// ObjectRef<T>: a value that stays on the rank that made it until a rank that needs it
// fetches it, as Ray's ObjectRef.
//
//   ObjectRef<Bytes> r = producer.ask_ref(&Producer::make, 64 << 20).get();  // stays there
//   consumer.ask(&Consumer::use, r).get();   // the consumer's rank fetches it directly
//   auto mine = rt.put(value);               // this rank's store
//   Bytes b = r.get();
//
// A ref travels as (rank, id, weight), 20 bytes, through any ask, tell or task; the
// value moves once, from its owner to whoever calls fetch()/get(), never through the
// driver. Large parts (troupe::Bytes, tensors) are kept as attachments and sent from
// the owner's buffers. Each rank's store holds at most RuntimeOptions::object_store_limit
// bytes in memory: beyond it, objects spill to RuntimeOptions::object_spill_folder if one
// is given, or a put or an ask_ref result is refused (ErrorCode::overloaded).
//
// An object is freed when the last reference to it, on any rank, is dropped: weighted
// reference counting (docs/TASKS_AND_OBJECTS.md), with no message on a copy and one message per
// rank that lets go. A reference that cannot be counted pins its object until free()
// or the runtime's shutdown: one inside a stored value or an actor's constructor
// arguments, one held by a rank that was lost, and one whose reply nobody waited for.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/actor_ref.hpp"

namespace troupe::actors {

namespace detail {

// The weight an object starts with, and the most a reference lends to one copy that
// leaves its rank: a rank can send one reference about four million times before the
// halving below begins, then 40 more hops in a chain.
inline constexpr std::uint64_t kWholeWeight = std::uint64_t{1} << 62;
inline constexpr std::uint64_t kMostLent = std::uint64_t{1} << 40;

// Where a rank's references give their weight back: its runtime while it lives. A
// reference may outlive the Runtime (declared before it, say); then it gives nothing.
class ObjectLedger {
 public:
  explicit ObjectLedger(Runtime* runtime) : runtime_(runtime) {}
  void release(int owner, std::uint64_t id, std::uint64_t weight);  // object_store.cpp
  void detach() {
    std::lock_guard lock(mutex_);
    runtime_ = nullptr;
  }

 private:
  std::mutex mutex_;
  Runtime* runtime_;
};

// One arrival of a reference on this rank, shared by all its copies here: its weight
// goes back to the owner when the last copy is dropped.
class ObjectHandle {
 public:
  ObjectHandle(std::shared_ptr<ObjectLedger> ledger, int owner, std::uint64_t id, std::uint64_t weight)
      : ledger_(std::move(ledger)), owner_(owner), id_(id), weight_(weight) {}
  ObjectHandle(const ObjectHandle&) = delete;
  ObjectHandle& operator=(const ObjectHandle&) = delete;
  ~ObjectHandle() {
    if (const std::uint64_t weight = weight_.load(); weight > 0) ledger_->release(owner_, id_, weight);
  }
  int owner() const { return owner_; }
  std::uint64_t id() const { return id_; }
  // The weight a copy leaving this rank takes along (into a message or a stored
  // value): half of this one's, at most kMostLent. With 1 left nothing can be split:
  // that unit is dropped instead, never to be returned, so the object stays pinned
  // and the copy goes uncounted (weight 0), as does any copy of an uncounted one.
  std::uint64_t lend() {
    std::uint64_t weight = weight_.load();
    while (true) {
      if (weight <= 1) {
        if (weight == 0 || weight_.compare_exchange_weak(weight, 0)) return 0;
        continue;
      }
      const std::uint64_t lent = std::min(weight / 2, kMostLent);
      if (weight_.compare_exchange_weak(weight, weight - lent)) return lent;
    }
  }

 private:
  std::shared_ptr<ObjectLedger> ledger_;
  int owner_;
  std::uint64_t id_;
  std::atomic<std::uint64_t> weight_;
};

}  // namespace detail

template <class T>
class ObjectRef {
 public:
  ObjectRef() = default;
  ObjectRef(Runtime* runtime, std::shared_ptr<detail::ObjectHandle> handle)
      : runtime_(runtime), handle_(std::move(handle)) {}

  int rank() const { return handle_ ? handle_->owner() : -1; }
  std::uint64_t id() const { return handle_ ? handle_->id() : 0; }
  bool valid() const { return runtime_ != nullptr; }

  // A copy of the value, from the owner's store (at once when this rank owns it).
  Future<T> fetch() const { return runtime().template fetch_object<T>(rank(), id()); }
  T get() const { return fetch().get(); }
  // Drops the object from its owner's store now, whatever references remain; later
  // fetches fail (unknown object). For pinned objects, or to free memory early.
  void free() const { runtime().free_object(rank(), id()); }

  // This reference's wire form (rank, id, weight lent to the copy); see save().
  std::uint64_t lend() const { return handle_ ? handle_->lend() : 0; }

 private:
  Runtime& runtime() const {
    TROUPE_CHECK(runtime_ != nullptr, "ObjectRef: this reference is empty (default-constructed)");
    return *runtime_;
  }
  Runtime* runtime_ = nullptr;
  std::shared_ptr<detail::ObjectHandle> handle_;
};

template <class Archive, class T>
void save(Archive& archive, const ObjectRef<T>& ref) {
  archive(ref.rank(), ref.id(), ref.lend());
}
template <class Archive, class T>
void load(Archive& archive, ObjectRef<T>& ref) {
  int rank = -1;
  std::uint64_t id = 0, weight = 0;
  archive(rank, id, weight);
  if (rank < 0) {
    ref = ObjectRef<T>();
    return;
  }
  Runtime& runtime = detail::receiving_runtime("ObjectRef");
  if (detail::uncounted_refs()) weight = 0;
  ref = ObjectRef<T>(&runtime, std::make_shared<detail::ObjectHandle>(runtime.object_ledger(), rank, id, weight));
}

template <class T>
ObjectRef<T> Runtime::put(const T& value) {
  std::string bytes;
  std::vector<Bytes> attachments;
  {
    detail::AttachmentScope scope(detail::outgoing_attachments(), &attachments);
    detail::append_serialized(bytes, value);
  }
  const std::uint64_t id = store_object(std::move(bytes), std::move(attachments));
  return ObjectRef<T>(this, std::make_shared<detail::ObjectHandle>(object_ledger_, rank_, id, detail::kWholeWeight));
}

template <class T>
Future<T> Runtime::fetch_object(int rank, std::uint64_t id) {
  const std::string what = detail::concat("fetch object ", id, " from rank ", rank);
  auto state = std::make_shared<detail::State<T>>(progress(), what);
  if (rank == rank_) {
    try {
      auto [bytes, attachments] = stored_object(id);
      detail::RuntimeScope runtime(this);
      detail::AttachmentScope scope(detail::incoming_attachments(), &attachments);
      detail::UncountedRefsScope uncounted;
      if constexpr (std::is_void_v<T>) {
        state->set_value();
      } else {
        T value{};
        detail::parse_exactly(bytes, "object", value);
        state->set_value(std::move(value));
      }
    } catch (...) {
      state->set_error(std::current_exception());
    }
    return Future<T>(state);
  }
  request_object(rank, id, std::make_shared<detail::TypedReply<T>>(what, state, /*uncounted=*/true));
  return Future<T>(state);
}

template <class T>
template <class M, class... A>
Future<ObjectRef<answer_t<typename MemberTraits<M>::Result>>> ActorRef<T>::ask_ref(M method, A&&... args) const {
  using R = answer_t<typename MemberTraits<M>::Result>;
  static_assert(!std::is_void_v<R>, "ask_ref: the method must return a value");
  Runtime* rt = &runtime();
  if (rank_ == rt->rank())  // made here: kept here
    return ask(method, std::forward<A>(args)...).then([rt](R value) { return rt->put(value); });
  const std::uint32_t index = detail::checked_method_index<T>(method);
  typename MemberTraits<M>::Args packed(std::forward<A>(args)...);
  auto state = std::make_shared<detail::State<ObjectRef<R>>>(rt->progress(), describe("ask_ref", index));
  std::string message = Runtime::new_message();
  std::vector<Bytes> attachments;
  {
    detail::AttachmentScope scope(detail::outgoing_attachments(), &attachments);
    detail::append_serialized(message, packed);
  }
  const std::uint64_t request = rt->send_request(
      rank_, id_, index, std::move(message), std::make_shared<detail::TypedReply<ObjectRef<R>>>(state->what(), state),
      std::move(attachments), std::nullopt, /*keep_result=*/true);
  state->set_call({rt->canceller(), rank_, id_, request, detail::is_collective<T>(index)}, std::nullopt);
  return Future<ObjectRef<R>>(state);
}

}  // namespace troupe::actors

namespace troupe {
using actors::ObjectRef;
}
