// FileReader's verification: every dataset's bytes hashed and compared with its
// checksum, contiguous ones straight from the file on two threads (verify_share splits
// the work between ranks, the resume's verify-while-loading between processes).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>

#include "file_reader_impl.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/xxhash64.hpp"

namespace troupe::checkpoint {

using detail::Failure;
using detail::h5_check;
using detail::Handle;
using detail::hex;
using detail::raw_offset;

namespace {

// A dataset whose bytes lie contiguous in the file, to be hashed straight from there.
struct RawExtent {
  const TensorInfo* tensor;
  haddr_t offset;
};

// What hashing some extents found: "" when every checksum matched; `storage` when the
// reason is a storage error (the file cannot be read now) rather than damage.
struct HashVerdict {
  std::string error;
  bool storage = false;
};

// Hashes each extent with pread into a small buffer that stays in this core's cache
// (the page cache's copy and the hash then run at cache speed, where a buffer as large
// as the tensor would miss on every line).
HashVerdict hash_extents(const std::string& file, const std::vector<RawExtent>& extents) {
  if (extents.empty()) return {};
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {troupe::detail::concat("open(", file, ") failed: ", errno_text(errno)), is_storage_errno(errno)};
  constexpr std::size_t kChunk = std::size_t{256} << 10;
  std::vector<std::byte> buffer(kChunk);
  HashVerdict verdict;
  std::string& error = verdict.error;
  for (const RawExtent& e : extents) {
    const TensorInfo& t = *e.tensor;
    Xxh64 state;
    const std::size_t bytes = t.nbytes();
    for (std::size_t at = 0; at < bytes && error.empty();) {
      const ssize_t n = ::pread(fd, buffer.data(), std::min(kChunk, bytes - at), static_cast<off_t>(e.offset + at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n == 0 ? 0 : errno;
        verdict.storage = err != 0 && is_storage_errno(err);
        error = troupe::detail::concat(file, ":", t.path, ": cannot read ", bytes,
                                       " bytes: ", n == 0 ? "file ends early (truncated?)" : errno_text(err));
        break;
      }
      state.update(buffer.data(), static_cast<std::size_t>(n));
      at += static_cast<std::size_t>(n);
    }
    if (!error.empty()) break;
    if (const std::uint64_t actual = state.digest(); actual != t.checksum) {
      error = troupe::detail::concat(file, ":", t.path, ": checksum mismatch, stored ", hex(t.checksum),
                                     ", data hashes to ", hex(actual), " (", tensor::dtype_name(t.dtype), " ",
                                     tensor::to_string(t.shape), ")");
      break;
    }
  }
  ::close(fd);
  return verdict;
}

}  // namespace

void FileReader::verify_all() const { verify_share(0, 1); }

void FileReader::verify_share(int part, int parts) const {
  TROUPE_CHECK(parts >= 1 && part >= 0 && part < parts, "checkpoint ", path_, ": verify_share(", part, ", ", parts,
               ") names no part");
  auto lock = detail::h5_lock();
  std::vector<TensorInfo> all = tensors("/");
  if (parts > 1) {  // this part's run of about total/parts bytes: a dataset goes where it starts
    std::size_t total = 0;
    for (const TensorInfo& t : all) total += t.nbytes();
    std::vector<TensorInfo> mine;
    std::size_t at = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      // Empty datasets are spread by index so that each is still checked once.
      const std::size_t owner = total == 0 ? i % static_cast<std::size_t>(parts)
                                           : std::min<std::size_t>(at * static_cast<std::size_t>(parts) / total,
                                                                   static_cast<std::size_t>(parts) - 1);
      if (owner == static_cast<std::size_t>(part)) mine.push_back(all[i]);
      at += all[i].nbytes();
    }
    all = std::move(mine);
  }
  // Contiguous datasets in native order (all of troupe's) are hashed from the file on
  // two threads, each taking about half the bytes; the rest (a file from elsewhere:
  // chunked, compressed, byte-swapped) through HDF5 into one reused buffer.
  std::vector<RawExtent> raw;
  std::vector<const TensorInfo*> other;
  for (const TensorInfo& t : all) {
    if (t.nbytes() == 0) {
      other.push_back(&t);
      continue;
    }
    Handle dset(h5_check(H5Dopen2(impl_->file.get(), t.path.c_str(), impl_->dapl.get()), "H5Dopen " + impl_->at(t.path),
                         Failure::format),
                H5Dclose);
    const haddr_t offset = raw_offset(dset.get(), t.dtype);
    if (offset == HADDR_UNDEF)
      other.push_back(&t);
    else
      raw.push_back({&t, offset});
  }
  std::size_t total = 0;
  for (const RawExtent& e : raw) total += e.tensor->nbytes();
  std::vector<RawExtent> first, second;  // in file order each, bytes split about evenly
  std::size_t taken = 0;
  for (const RawExtent& e : raw) {
    (taken < total / 2 ? first : second).push_back(e);
    taken += e.tensor->nbytes();
  }
  HashVerdict second_verdict;
  std::thread helper;
  if (!second.empty()) helper = std::thread([&] { second_verdict = hash_extents(path_, second); });
  HashVerdict verdict = hash_extents(path_, first);
  if (helper.joinable()) helper.join();
  if (verdict.error.empty() || (second_verdict.storage && !verdict.storage)) verdict = second_verdict;
  if (verdict.storage) TROUPE_THROW(StorageError, "checkpoint ", verdict.error, ", a storage error, not damage");
  if (!verdict.error.empty()) TROUPE_THROW(FormatError, "checkpoint ", verdict.error);

  std::size_t largest = 0;
  for (const TensorInfo* t : other) largest = std::max(largest, t->nbytes());
  auto buffer = tensor::Storage::allocate(largest, tensor::Device::cpu());
  for (const TensorInfo* t : other) read_into(t->path, tensor::Tensor::from_storage(buffer, t->shape, t->dtype), true);
}

}  // namespace troupe::checkpoint
