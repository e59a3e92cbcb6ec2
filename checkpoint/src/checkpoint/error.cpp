#include "troupe/checkpoint/error.hpp"

#include <cerrno>
#include <cstring>

namespace troupe::checkpoint {

bool is_storage_errno(int err) {
  switch (err) {
    case EIO:
    case EACCES:
    case EPERM:
    case ESTALE:
    case EAGAIN:
    case EBUSY:
    case EINTR:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOSPC:
    case EDQUOT:
    case EROFS:
    case EFBIG:
    case ETIMEDOUT:
    case ENOLCK:
    case EREMOTEIO:
    case ENOTCONN:
    case ECONNRESET:
    case ECONNABORTED:
    case EHOSTDOWN:
    case EHOSTUNREACH:
    case ENETDOWN:
    case ENETUNREACH:
    case ENOBUFS:
    case ETXTBSY: return true;
    default: return false;
  }
}

std::string errno_text(int err) {
  const char* name = strerrordesc_np(err) ? strerrorname_np(err) : nullptr;
  return std::string(name ? name : "errno " + std::to_string(err)) + " (" + std::strerror(err) + ")";
}

void throw_os_error(const std::string& call, const std::string& what, int err) {
  std::string message = "checkpoint: " + call + "(" + what + ") failed: " + errno_text(err);
  if (is_storage_errno(err)) throw StorageError(message + ", a storage error, not damage");
  throw CheckpointError(message);
}

}  // namespace troupe::checkpoint
