// Every HDF5 C call in the checkpoint module goes through these helpers (HighFive's
// one-wrapper-per-call habit): a negative return becomes an exception whose message says
// what we were doing (file, object) followed by HDF5's own error stack, and every hid_t
// is owned by a Handle that closes it. HDF5's automatic printing of its error stack to
// stderr is switched off once, since the stack now travels in the exception.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>
#include <utility>

#include "troupe/checkpoint/error.hpp"

namespace troupe::checkpoint::detail {

// The installed HDF5 is not built thread-safe, so every entry is serialised by one lock
// (recursive: a writer method may call a helper that also locks). It is a function-local
// static, not a singleton object with state of ours: it guards the library, which is
// process-global by itself.
std::unique_lock<std::recursive_mutex> h5_lock();

// Turns off HDF5's stderr error printing (idempotent).
void h5_init();
// "H5Fopen(): unable to open file: file signature not found; ...", most specific first.
std::string h5_error_stack();

enum class Failure { io, format };
[[noreturn]] void h5_fail(Failure kind, const std::string& what);
// For a call whose failure can mean "no such object" (H5Lget_info, H5Oget_info):
// throws StorageError when HDF5's error stack quotes a storage errno (the answer is
// unknown, not "no"); otherwise clears the stack and returns.
void fail_if_storage_error(const std::string& what);

template <class R>
R h5_check(R result, const std::string& what, Failure kind = Failure::io) {
  if (result < 0) h5_fail(kind, what);
  return result;
}

// Owns one hid_t and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; errors from the close are returned, not thrown (destructors use this).
  herr_t reset() {
    herr_t r = 0;
    if (id_ >= 0 && closer_) r = closer_(id_);
    id_ = H5I_INVALID_HID;
    return r;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

}  // namespace troupe::checkpoint::detail
