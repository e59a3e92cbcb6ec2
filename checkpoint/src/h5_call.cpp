#include "h5_call.hpp"

#include <string>

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

void h5_fail(Failure kind, const std::string& what) {
  std::string message = what + " [HDF5: " + h5_error_stack() + "]";
  if (kind == Failure::format) throw FormatError(message);
  throw CheckpointError(message);
}

}  // namespace troupe::checkpoint::detail
