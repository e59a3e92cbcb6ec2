#include "h5_call.hpp"

#include <cstdlib>
#include <string>
#include <string_view>

namespace troupe::checkpoint::detail {

std::unique_lock<std::recursive_mutex> h5_lock() {
  static std::recursive_mutex mutex;
  return std::unique_lock<std::recursive_mutex>(mutex);
}

void h5_init() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

namespace {
herr_t collect(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n >= 4) return 0;  // the outer frames repeat the inner ones in vaguer words
  if (!out->empty()) out->append("; ");
  out->append(err->func_name ? err->func_name : "?");
  out->append("(): ");
  out->append(err->desc ? err->desc : "");
  return 0;
}
}  // namespace

std::string h5_error_stack() {
  std::string out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? std::string("no HDF5 error recorded") : out;
}

namespace {
// The errno in "unable to lock file, errno = 11, error message = ...", or 0.
int errno_in_stack(const std::string& stack) {
  constexpr std::string_view kMark = "errno = ";
  const auto at = stack.find(kMark);
  return at == std::string::npos ? 0 : std::atoi(stack.c_str() + at + kMark.size());
}
}  // namespace

void fail_if_storage_error(const std::string& what) {
  std::string stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect, &stack);
  if (const int err = errno_in_stack(stack); err != 0 && is_storage_errno(err)) h5_fail(Failure::io, what);
  H5Eclear2(H5E_DEFAULT);
}

void h5_fail(Failure kind, const std::string& what) {
  const std::string stack = h5_error_stack();
  std::string message = what + " [HDF5: " + stack + "]";
  // HDF5's file drivers quote the errno of the call that failed. One that names the
  // storage (EIO, a lock held elsewhere, EACCES...) makes this a StorageError whatever
  // the caller expected: a file that cannot be read now is not a damaged file.
  if (const int err = errno_in_stack(stack); err != 0 && is_storage_errno(err))
    throw StorageError(message + ": " + errno_text(err) + ", a storage error, not damage");
  if (kind == Failure::format) throw FormatError(message);
  throw CheckpointError(message);
}

}  // namespace troupe::checkpoint::detail
