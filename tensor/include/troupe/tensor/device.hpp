// Where a tensor's bytes live: host memory, or one CUDA device when troupe was built
// with the CUDA toolkit (TROUPE_CUDA). Asking for CUDA in a build without it, or on a
// machine without a GPU, fails with a message that says which of the two it is.
// The meta device holds no bytes at all: a tensor there has a shape, a dtype and a
// description of its values (meta.hpp), so a model too large for one rank can be
// described whole and each rank materialise only its shards.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace troupe::tensor {

enum class DeviceKind : std::uint8_t { cpu, cuda, meta };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  static constexpr Device meta() { return {DeviceKind::meta, 0}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::cpu; }
  constexpr bool is_cuda() const { return kind == DeviceKind::cuda; }
  constexpr bool is_meta() const { return kind == DeviceKind::meta; }
  friend constexpr bool operator==(Device, Device) = default;
};

// "cpu", "cuda:0" or "meta".
std::string to_string(Device d);
std::ostream& operator<<(std::ostream& out, Device d);
// Parses "cpu", "cuda", "cuda:N", "meta".
Device device_from_string(const std::string& text);

// True when this build has CUDA support compiled in.
bool cuda_built();
// Number of usable GPUs; 0 without CUDA support or without a driver/device.
int cuda_device_count();
inline bool cuda_available() { return cuda_device_count() > 0; }
// CUDA work is asynchronous: ops queue kernels on the device's default stream, in
// order, and return. A copy to the host (to(cpu), item()) waits for what it reads;
// this waits for everything queued (timing, handing memory to another library).
// A no-op without CUDA.
void cuda_synchronize();
// Makes `d` the calling thread's current CUDA device (CUDA's current device is per
// thread): the kernels this thread launches on existing tensors go there. Allocating a
// CUDA tensor does this too. A no-op for the CPU.
void cuda_set_device(Device d);
// Timing work on the GPU (timelines): an event queued on the calling thread's current
// device's stream now, the milliseconds between two (waiting for the later), and the
// event freed. InvalidArgument without CUDA.
void* cuda_event_record();
double cuda_event_elapsed_ms(void* from, void* to);
void cuda_event_destroy(void* event);
// Throws InvalidArgument naming `op` unless `d` can be used here.
void check_device_usable(Device d, const char* op);

}  // namespace troupe::tensor
