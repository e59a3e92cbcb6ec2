#include "troupe/tensor/device.hpp"

#include <ostream>

#include "cuda/cuda_table.hpp"
#include "troupe/error.hpp"

namespace troupe::tensor {

std::string to_string(Device d) {
  if (d.is_meta()) return "meta";
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

std::ostream& operator<<(std::ostream& out, Device d) { return out << to_string(d); }

Device device_from_string(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text == "meta") return Device::meta();
  if (text.rfind("cuda:", 0) == 0) {
    const std::string index = text.substr(5);
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos)
      return Device::cuda(std::stoi(index));
  }
  TROUPE_THROW(InvalidArgument, "unknown device '", text, "'; expected cpu, cuda, cuda:N or meta");
}

bool cuda_built() {
#if defined(TROUPE_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
  // Asking the driver costs milliseconds the first time; the answer does not change
  // while the process runs.
  static const int count = cuda_backend::device_count();
  return count;
}

void cuda_set_device(Device d) {
  if (!d.is_cuda()) return;
  check_device_usable(d, "cuda_set_device");
  cuda_backend::set_device(d.index);
}

void cuda_synchronize() {
  if (cuda_available()) cuda_backend::synchronize();
}

void* cuda_event_record() { return cuda_backend::event_record(); }

double cuda_event_elapsed_ms(void* from, void* to) { return cuda_backend::event_elapsed_ms(from, to); }

void cuda_event_destroy(void* event) { cuda_backend::event_destroy(event); }

void check_device_usable(Device d, const char* op) {
  if (d.is_cpu() || d.is_meta()) return;
  if (!cuda_built())
    TROUPE_THROW(InvalidArgument, op, ": ", to_string(d),
                 " requested, but troupe was built without CUDA (configure with -DTROUPE_CUDA=ON)");
  const int count = cuda_device_count();
  if (count == 0 && !cuda_backend::why_unavailable().empty())
    TROUPE_THROW(InvalidArgument, op, ": ", to_string(d), " requested, but ", cuda_backend::why_unavailable());
  if (d.index < 0 || d.index >= count)
    TROUPE_THROW(InvalidArgument, op, ": ", to_string(d), " requested, but this machine has ", count,
                 " usable CUDA device(s)");
}

}  // namespace troupe::tensor
