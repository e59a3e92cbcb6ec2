#include "object_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "troupe/actors/errors.hpp"
#include "troupe/error.hpp"

namespace troupe::actors::detail {

namespace {

namespace fs = std::filesystem;
using ::troupe::detail::concat;

constexpr char kSpillMagic[16] = "troupe-object-1";

RemoteError store_error(ErrorCode code, int rank, const char* method, const std::string& message) {
  return RemoteError({code, rank, "object store", method, "", message});
}

// Runs `attempt` (0 or an errno) until it succeeds, fails for good, or has failed
// three times with a transient error.
int with_retries(const std::function<int()>& attempt) {
  static constexpr std::chrono::milliseconds kPauses[] = {std::chrono::milliseconds(10), std::chrono::milliseconds(50)};
  int error = attempt();
  for (const auto pause : kPauses) {
    if (error != EINTR && error != EAGAIN && error != EIO) break;
    std::this_thread::sleep_for(pause);
    error = attempt();
  }
  return error;
}

int write_all(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

// 0, an errno, or -1 for a file that ends early.
int read_all(int fd, void* data, std::size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return -1;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "host";
  return name;
}

}  // namespace

ObjectStore::ObjectStore(int rank, ObjectStoreOptions options) : rank_(rank), options_(std::move(options)) {
  if (!options_.spill_folder.empty())
    folder_ =
        (fs::path(options_.spill_folder) / concat("troupe-objects-", host_name(), "-", ::getpid(), "-rank", rank_))
            .string();
}

ObjectStore::~ObjectStore() {
  if (folder_.empty()) return;
  std::error_code ec;
  fs::remove_all(folder_, ec);  // best effort: a leftover folder names its pid
}

std::string ObjectStore::file_of(std::uint64_t id) const { return folder_ + "/" + std::to_string(id); }

std::uint64_t ObjectStore::store(std::string bytes, std::vector<Bytes> attachments, std::uint64_t weight) {
  std::size_t size = bytes.size();
  for (const Bytes& b : attachments) size += b.size();
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_id_;
  if (memory_bytes_ + size > options_.memory_limit) {
    const auto refuse = [&](const std::string& why) {
      return store_error(ErrorCode::overloaded, rank_, "put",
                         concat("an object of ", size, " bytes does not fit: the store holds ", memory_bytes_,
                                " of its ", options_.memory_limit, " bytes (RuntimeOptions::object_store_limit)", why));
    };
    if (folder_.empty())
      throw refuse("; free() what is done with, or give RuntimeOptions::object_spill_folder to spill to disk");
    if (size > options_.memory_limit) {  // larger than memory may ever hold: straight to disk
      Object object{std::move(bytes), std::move(attachments), size, weight, false};
      if (std::string why = spill(id, object); !why.empty()) throw refuse(", and writing it to disk failed: " + why);
      objects_.emplace(id, std::move(object));
      ++next_id_;
      return id;
    }
    if (std::string why = make_room(size); !why.empty()) throw refuse(", and spilling to make room failed: " + why);
  }
  objects_.emplace(id, Object{std::move(bytes), std::move(attachments), size, weight, false});
  in_memory_.insert(id);
  memory_bytes_ += size;
  ++next_id_;
  return id;
}

std::string ObjectStore::make_room(std::size_t size) {
  while (memory_bytes_ + size > options_.memory_limit && !in_memory_.empty()) {
    const std::uint64_t oldest = *in_memory_.begin();
    Object& object = objects_.at(oldest);
    if (std::string why = spill(oldest, object); !why.empty()) return why;
    in_memory_.erase(in_memory_.begin());
    memory_bytes_ -= object.size;
  }
  return "";
}

// Writes the object to its file and drops its memory; on failure it is left as it was.
std::string ObjectStore::spill(std::uint64_t id, Object& object) {
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec) return concat("cannot create the spill folder ", folder_, ": ", ec.message());
  struct statvfs disk {};
  if (::statvfs(folder_.c_str(), &disk) == 0 && disk.f_blocks > 0) {
    const double total = static_cast<double>(disk.f_blocks) * static_cast<double>(disk.f_frsize);
    const double free = static_cast<double>(disk.f_bavail) * static_cast<double>(disk.f_frsize);
    if (total - free + static_cast<double>(object.size) > options_.max_disk_use * total)
      return concat(object.size, " more bytes would fill ", folder_, "'s file system past ",
                    options_.max_disk_use * 100, "% (", static_cast<long long>(free), " bytes free)");
  }
  const std::string path = file_of(id);
  std::vector<std::uint64_t> head{object.bytes.size(), object.attachments.size()};
  for (const Bytes& b : object.attachments) head.push_back(b.size());
  const int error = with_retries([&] {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    int e = write_all(fd, kSpillMagic, sizeof kSpillMagic);
    if (e == 0) e = write_all(fd, head.data(), head.size() * sizeof(std::uint64_t));
    if (e == 0) e = write_all(fd, object.bytes.data(), object.bytes.size());
    for (std::size_t i = 0; e == 0 && i < object.attachments.size(); ++i)
      e = write_all(fd, object.attachments[i].data(), object.attachments[i].size());
    if (::close(fd) != 0 && e == 0) e = errno;
    return e;
  });
  if (error != 0) {
    ::unlink(path.c_str());
    return concat("writing ", path, ": ", std::strerror(error));
  }
  object.bytes.clear();
  object.bytes.shrink_to_fit();
  object.attachments.clear();
  object.spilled = true;
  spilled_bytes_ += object.size;
  return "";
}

std::pair<std::string, std::vector<Bytes>> ObjectStore::load(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  const auto it = objects_.find(id);
  if (it == objects_.end())
    throw store_error(ErrorCode::unknown_actor, rank_, "fetch",
                      concat("no object ", id, " on this rank (never stored, or freed)"));
  const Object& object = it->second;
  if (!object.spilled) return {object.bytes, object.attachments};
  const std::string path = file_of(id);
  std::string bytes;
  std::vector<Bytes> attachments;
  std::string damage;  // the file is not what was written
  const int error = with_retries([&]() -> int {
    damage.clear();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    struct Close {
      int fd;
      ~Close() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) return errno;
    char magic[sizeof kSpillMagic] = {};
    std::uint64_t counts[2] = {};
    int e = read_all(fd, magic, sizeof magic);
    if (e == 0) e = read_all(fd, counts, sizeof counts);
    if (e == 0 && (std::memcmp(magic, kSpillMagic, sizeof kSpillMagic) != 0 || counts[1] > (std::uint64_t{1} << 20)))
      e = -1;
    std::vector<std::uint64_t> sizes(e == 0 ? counts[1] : 0);
    if (e == 0) e = read_all(fd, sizes.data(), sizes.size() * sizeof(std::uint64_t));
    if (e == 0) {  // the parts must be the object's size and fill the file exactly
      std::uint64_t payload = counts[0];
      for (const std::uint64_t s : sizes) payload += std::min<std::uint64_t>(s, object.size + 1);
      const std::uint64_t head_bytes = sizeof kSpillMagic + sizeof counts + sizes.size() * sizeof(std::uint64_t);
      if (counts[0] > object.size || payload != object.size ||
          head_bytes + payload != static_cast<std::uint64_t>(st.st_size))
        e = -1;
    }
    if (e == 0) {
      bytes.resize(counts[0]);
      e = read_all(fd, bytes.data(), bytes.size());
    }
    attachments.clear();
    for (std::size_t i = 0; e == 0 && i < sizes.size(); ++i) {
      std::vector<std::byte> part(sizes[i]);
      e = read_all(fd, part.data(), part.size());
      attachments.emplace_back(std::move(part));
    }
    if (e == -1) {
      damage = "it is not the object that was written there (cut short or overwritten)";
      return 0;
    }
    return e;
  });
  if (error != 0 || !damage.empty())
    throw store_error(ErrorCode::storage_failed, rank_, "fetch",
                      concat("object ", id, " was spilled to ", path,
                             " and cannot be read back: ", damage.empty() ? std::strerror(error) : damage));
  return {std::move(bytes), std::move(attachments)};
}

void ObjectStore::erase(std::map<std::uint64_t, Object>::iterator it) {
  if (it->second.spilled) {
    ::unlink(file_of(it->first).c_str());
    spilled_bytes_ -= it->second.size;
  } else {
    in_memory_.erase(it->first);
    memory_bytes_ -= it->second.size;
  }
  objects_.erase(it);
}

void ObjectStore::free(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  if (const auto it = objects_.find(id); it != objects_.end()) erase(it);
}

bool ObjectStore::release(std::uint64_t id, std::uint64_t weight, std::uint64_t* lent) {
  std::lock_guard lock(mutex_);
  const auto it = objects_.find(id);
  if (it == objects_.end()) return true;  // freed by hand already
  if (weight > it->second.weight_out) {
    if (lent != nullptr) *lent = it->second.weight_out;
    return false;
  }
  it->second.weight_out -= weight;
  if (it->second.weight_out == 0) erase(it);
  return true;
}

std::size_t ObjectStore::memory_bytes() const {
  std::lock_guard lock(mutex_);
  return memory_bytes_;
}

std::size_t ObjectStore::spilled_bytes() const {
  std::lock_guard lock(mutex_);
  return spilled_bytes_;
}

std::size_t ObjectStore::spilled_objects() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(objects_.begin(), objects_.end(), [](const auto& entry) { return entry.second.spilled; }));
}

}  // namespace troupe::actors::detail
