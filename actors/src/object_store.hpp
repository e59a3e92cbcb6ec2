// ObjectStore: one rank's objects (Runtime::put, ActorRef::ask_ref), held in memory up
// to a bound and, with a spill folder, beyond it on disk, as Ray's object store spills.
//
// Spilling: a new object that does not fit in memory first moves the oldest objects
// held in memory to files of their own until it fits (or goes to disk itself when it
// alone is larger than the bound). A spilled object is read back from its file at each
// fetch and stays on disk until it is freed; its file is removed then, and every file
// left when the store is destroyed. The folder's file system is never filled past
// max_disk_use (Ray's local_fs_capacity_threshold): an object that would is refused.
//
// A write or read that fails is retried (EINTR, EAGAIN, EIO: twice more after 10 and
// 50 ms); one that still fails, or fails for good (ENOSPC, EACCES, ...), is a
// RemoteError naming the file and the system's reason: `overloaded` for a put the store
// could not make room for (nothing is lost: the objects it tried to move stay in
// memory), `storage_failed` for a fetch. A spilled file that is not what was written
// (cut short, overwritten) is `storage_failed` too, never a wrong value.
//
// Thread-safe: one mutex, held across a spill's file I/O (a put or fetch of another
// object waits for it; the common case, everything in memory, does no I/O).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/bytes.hpp"

namespace troupe::actors::detail {

struct ObjectStoreOptions {
  std::size_t memory_limit = 0;  // bytes held in memory
  std::string spill_folder;      // "" spills nothing: past memory_limit a put is refused
  double max_disk_use = 0.95;    // the spill folder's file system's used share, at most
};

class ObjectStore {
 public:
  ObjectStore(int rank, ObjectStoreOptions options);
  ~ObjectStore();  // removes the spill files, and this store's folder
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Keeps a new object (its serialized bytes and large parts); returns its id, which
  // starts with all of `weight` lent out.
  std::uint64_t store(std::string bytes, std::vector<Bytes> attachments, std::uint64_t weight);
  // A copy of the bytes and the attachments (shared in memory; read afresh if spilled).
  std::pair<std::string, std::vector<Bytes>> load(std::uint64_t id) const;
  // Drops the object now. Freeing an unknown id does nothing.
  void free(std::uint64_t id);
  // `weight` of the object's references came back; at none left out, it is freed.
  // Returns false when more came back than was lent (the object is kept; *lent, if
  // given, says how much was).
  bool release(std::uint64_t id, std::uint64_t weight, std::uint64_t* lent = nullptr);

  std::size_t memory_bytes() const;
  std::size_t spilled_bytes() const;
  std::size_t spilled_objects() const;

 private:
  struct Object {
    std::string bytes;  // empty while spilled
    std::vector<Bytes> attachments;
    std::size_t size = 0;
    std::uint64_t weight_out = 0;  // lent to references and not yet given back
    bool spilled = false;
  };
  std::string make_room(std::size_t size);  // "" or why it could not
  std::string spill(std::uint64_t id, Object& object);
  std::string file_of(std::uint64_t id) const;
  void erase(std::map<std::uint64_t, Object>::iterator it);

  int rank_;
  ObjectStoreOptions options_;
  std::string folder_;  // this store's own, inside options_.spill_folder; made at the first spill
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Object> objects_;
  std::set<std::uint64_t> in_memory_;  // oldest first: the order objects are spilled in
  std::size_t memory_bytes_ = 0, spilled_bytes_ = 0;
  std::uint64_t next_id_ = 1;
};

}  // namespace troupe::actors::detail
