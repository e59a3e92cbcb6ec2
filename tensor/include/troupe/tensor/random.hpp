// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11).
//
// Element i of a draw is a pure function of (seed, offset + i): no hidden state per
// thread or device, so the same Generator state gives the same tensor on every rank,
// on CPU and GPU, whatever the thread count. A Generator's whole state is two
// integers, which is what a checkpoint stores to resume a run exactly.
#pragma once

#include <cstdint>

#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0, std::uint64_t offset = 0) : seed_(seed), offset_(offset) {}

  std::uint64_t seed() const { return seed_; }
  // Philox blocks already used; the next draw starts here.
  std::uint64_t offset() const { return offset_; }
  void set_state(std::uint64_t seed, std::uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Claims n blocks (4 random 32-bit words each) and returns the first.
  std::uint64_t reserve(std::uint64_t blocks) {
    const auto first = offset_;
    offset_ += blocks;
    return first;
  }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_;
};

// Uniform on [lo, hi) (each element from one 32-bit word).
Tensor uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype = DType::f32,
               Device device = Device::cpu());
// Normal(mean, std) by Box-Muller, computed in double and rounded to dtype.
Tensor normal(const Shape& shape, double mean, double std, Generator& gen, DType dtype = DType::f32,
              Device device = Device::cpu());
void uniform_(Tensor& t, double lo, double hi, Generator& gen);
void normal_(Tensor& t, double mean, double std, Generator& gen);

}  // namespace troupe::tensor
