// ObjectRef<T>: a value that stays on the rank that made it until a rank that needs it
// fetches it, as Ray's ObjectRef.
//
//   ObjectRef<Bytes> r = producer.ask_ref(&Producer::make, 64 << 20).get();  // stays there
//   consumer.ask(&Consumer::use, r).get();   // the consumer's rank fetches it directly
//   auto mine = rt.put(value);               // this rank's store
//   Bytes b = r.get();  r.free();
//
// A ref travels as (rank, id), 12 bytes, through any ask, tell or task; the value moves
// once, from its owner to whoever calls fetch()/get(), never through the driver. Large
// parts (troupe::Bytes, tensors) are kept as attachments and sent from the owner's
// buffers. Each rank's store is bounded (RuntimeOptions::object_store_limit): a put or
// an ask_ref result beyond it is refused (ErrorCode::overloaded), never spilled.
// Objects live until free() or the runtime's shutdown: there is no distributed
// reference counting yet.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/actors/actor_ref.hpp"

namespace troupe::actors {

template <class T>
class ObjectRef {
 public:
  ObjectRef() = default;
  ObjectRef(Runtime* runtime, int rank, std::uint64_t id) : runtime_(runtime), rank_(rank), id_(id) {}

  int rank() const { return rank_; }
  std::uint64_t id() const { return id_; }
  bool valid() const { return runtime_ != nullptr; }

  // A copy of the value, from the owner's store (at once when this rank owns it).
  Future<T> fetch() const { return runtime().template fetch_object<T>(rank_, id_); }
  T get() const { return fetch().get(); }
  // Drops the object from its owner's store; later fetches fail (unknown object).
  void free() const { runtime().free_object(rank_, id_); }

 private:
  Runtime& runtime() const {
    TROUPE_CHECK(runtime_ != nullptr, "ObjectRef: this reference is empty (default-constructed)");
    return *runtime_;
  }
  Runtime* runtime_ = nullptr;
  int rank_ = -1;
  std::uint64_t id_ = 0;
};

template <class Archive, class T>
void save(Archive& archive, const ObjectRef<T>& ref) {
  archive(ref.rank(), ref.id());
}
template <class Archive, class T>
void load(Archive& archive, ObjectRef<T>& ref) {
  int rank = -1;
  std::uint64_t id = 0;
  archive(rank, id);
  ref = ObjectRef<T>(&detail::receiving_runtime("ObjectRef"), rank, id);
}

template <class T>
ObjectRef<T> Runtime::put(const T& value) {
  std::string bytes;
  std::vector<Bytes> attachments;
  {
    detail::AttachmentScope scope(detail::outgoing_attachments(), &attachments);
    detail::append_serialized(bytes, value);
  }
  return ObjectRef<T>(this, rank_, store_object(std::move(bytes), std::move(attachments)));
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
  request_object(rank, id, std::make_shared<detail::TypedReply<T>>(what, state));
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
