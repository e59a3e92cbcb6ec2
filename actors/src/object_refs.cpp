// The runtime's side of object references: values kept in this rank's ObjectStore
// (object_store.hpp) where they were made (Runtime::put, ActorRef::ask_ref) until a
// rank that needs one fetches it, and freed when every reference's weight has come
// back. See object_ref.hpp and docs/TASKS_AND_OBJECTS.md.
#include <cstdio>

#include "object_store.hpp"
#include "scheduler.hpp"
#include "transport.hpp"
#include "troupe/actors/runtime.hpp"
#include "wire.hpp"

namespace troupe::actors {

namespace detail {
bool& uncounted_refs() {
  thread_local bool uncounted = false;
  return uncounted;
}

void ObjectLedger::release(int owner, std::uint64_t id, std::uint64_t weight) {
  std::lock_guard lock(mutex_);
  if (runtime_ != nullptr) runtime_->release_object(owner, id, weight);
}
}  // namespace detail

std::uint64_t Runtime::store_object(std::string bytes, std::vector<Bytes> attachments) {
  return objects_->store(std::move(bytes), std::move(attachments), detail::kWholeWeight);
}

std::pair<std::string, std::vector<Bytes>> Runtime::stored_object(std::uint64_t id) const { return objects_->load(id); }

std::size_t Runtime::object_store_size() const { return objects_->memory_bytes(); }

std::size_t Runtime::object_store_spilled() const { return objects_->spilled_bytes(); }

void Runtime::request_object(int rank, std::uint64_t id, std::shared_ptr<detail::ReplyHandler> reply) {
  detail::Header h;
  h.kind = detail::Kind::fetch_object;
  h.actor = id;
  send_with_reply(rank, h, new_message(), std::move(reply));
}

void Runtime::handle_fetch(int source, std::uint64_t request, std::uint64_t id) {
  // Not on the receiving thread: a large reply waits for its peer to take it, and a
  // receiving thread does not receive meanwhile -- two ranks fetching large objects
  // from each other would each wait for the other.
  scheduler_->post_task([this, source, request, id] {
    std::string bytes = new_message();
    std::vector<Bytes> attachments;
    try {
      auto [payload, parts] = stored_object(id);
      bytes += payload;
      attachments = std::move(parts);
    } catch (const RemoteError& e) {
      return reply_error(source, request, e.info());
    }
    // The large parts go from the store's own buffers, as any reply's attachments.
    reply_value(source, request, std::move(bytes), attachments);
  });
}

void Runtime::tell_owner(int rank, detail::Kind kind, std::uint64_t id, std::uint64_t weight) {
  std::string message = new_message();
  detail::Header h;
  h.kind = kind;
  h.actor = id;
  h.request = weight;
  detail::write_header(message, h);
  transport_->send(rank, message);
}

void Runtime::free_object(int rank, std::uint64_t id) {
  {
    std::lock_guard lock(pending_mutex_);
    if (shut_down_) return;  // the stores are gone with their runtimes
  }
  if (rank != rank_) return tell_owner(rank, detail::Kind::free_object, id, 0);
  objects_->free(id);
}

void Runtime::release_object(int rank, std::uint64_t id, std::uint64_t weight) {
  {
    std::lock_guard lock(pending_mutex_);
    if (shut_down_) return;
  }
  if (rank != rank_) return tell_owner(rank, detail::Kind::release_object, id, weight);
  std::uint64_t lent = 0;
  if (!objects_->release(id, weight, &lent))
    // Only a buggy or hostile sender gives back more than was lent: keep the object.
    std::fprintf(stderr, "troupe: rank %d: object %llu: %llu of weight given back, only %llu lent; kept\n", rank_,
                 static_cast<unsigned long long>(id), static_cast<unsigned long long>(weight),
                 static_cast<unsigned long long>(lent));
}

void Runtime::reply_kept(int rank, std::uint64_t request, std::string result, std::vector<Bytes> attachments) {
  const std::uint64_t id = store_object(result.substr(sizeof(detail::Header)), std::move(attachments));
  std::string reply = new_message();
  detail::append_serialized(reply, rank_, id, detail::kWholeWeight);  // an ObjectRef's wire form
  reply_value(rank, request, std::move(reply));
}

}  // namespace troupe::actors
