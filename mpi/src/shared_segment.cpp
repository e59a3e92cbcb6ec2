#include "troupe/mpi/shared_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "troupe/mpi/mpi_error.hpp"

namespace troupe::mpi {

std::string unique_segment_name(MPI_Comm comm, std::string_view prefix) {
  static std::atomic<std::uint64_t> made{0};
  std::uint64_t token[3] = {static_cast<std::uint64_t>(::getpid()),
                            static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()),
                            made.fetch_add(1)};
  TROUPE_MPI_CHECK(MPI_Bcast(token, 3, MPI_UINT64_T, 0, comm));
  return std::string(prefix) + std::to_string(token[0]) + "-" + std::to_string(token[1]) + "-" +
         std::to_string(token[2]);
}

std::byte* map_shared_segment(const std::string& name, std::size_t bytes, bool create) {
  const int fd = ::shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (!create || ::ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

void unlink_shared_segment(const std::string& name) { ::shm_unlink(name.c_str()); }

void unmap_shared_segment(std::byte* base, std::size_t bytes) {
  if (base != nullptr) ::munmap(base, bytes);
}

}  // namespace troupe::mpi
