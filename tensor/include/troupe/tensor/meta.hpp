// The meta device: tensors with a shape and a dtype but no memory (PyTorch's "meta"),
// each carrying a description of its values -- a constant, or a Philox uniform/normal
// draw at a recorded (seed, offset) -- so that materialising any range of it later
// gives exactly the bits the same calls would have written on the CPU.
//
//   tensor::Generator gen(seed);
//   nn::GPT model(config, seed, DType::f32, Device::meta());  // shapes only, no bytes
//   Tensor mine = Tensor::empty({n}, DType::f32);
//   tensor::materialize_into(mine, model.named_parameters()[0].param->data, begin);
//
// A meta tensor is described by the factories (empty, zeros, ones, full) and the
// whole-tensor initialisers (fill_, zero_, uniform_, normal_, which advance the
// generator exactly as on the CPU); to(device) materialises the whole tensor, and so
// Module::to(device) a whole model; any other operation that needs its bytes is an
// InvalidArgument saying it is on the meta device. Only a whole storage can be
// described: filling a view of part of one is refused.
#pragma once

#include <cstdint>

#include "troupe/tensor/storage.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

inline bool is_meta(const Tensor& t) { return t.defined() && t.device().is_meta(); }

// Writes elements [begin, begin + dst.numel()) of the flattened meta tensor `meta`
// into `dst` (any device and dtype: values are computed in meta's dtype, then converted
// as copy_ would). Host memory used: `dst` plus at most a 1M-element staging block.
void materialize_into(const Tensor& dst, const Tensor& meta, std::int64_t begin);
// The whole of `meta` on `device`, with its shape and dtype.
Tensor materialize(const Tensor& meta, Device device);

namespace detail {
// Records `fill` as the description of meta tensor t, which must view its whole storage.
void describe_meta_fill(const Tensor& t, const MetaFill& fill, const char* op);
}  // namespace detail

}  // namespace troupe::tensor
