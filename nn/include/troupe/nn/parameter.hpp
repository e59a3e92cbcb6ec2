// Parameter: a trainable tensor and its gradient.
//
// `grad` starts undefined. A layer's backward creates it the first time and from
// then on ADDS into it, never replacing the tensor: the gradient may be a view into
// a flat communication bucket that DDP owns, and replacing the handle would
// silently detach the parameter from that bucket. `zero_grad(set_to_none=true)`
// is the one place that drops a gradient, as in PyTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/tensor/tensor.hpp"

namespace troupe::nn {

using tensor::Tensor;

// Part of a model parameter held by a flat shard (FSDP, ZeRO-2): its name and full
// shape, and which of the shard's elements, [begin, end), hold some of it.
struct ParameterSegment {
  std::string name;
  tensor::Shape shape;
  std::int64_t begin = 0, end = 0;
};

struct Parameter {
  Tensor data;
  Tensor grad;
  // Modules that registered it: more than one when tied (Module::register_shared_parameter).
  // Its gradient is final after the last use's backward, so grad_ready fires then.
  int uses = 1;
  int uses_done = 0;  // in the current backward
  // Empty for a model's own parameter. For a flat shard, the parameters it packs, so
  // options chosen per parameter (weight decay on matrices only) still apply to it.
  std::vector<ParameterSegment> segments{};
};

// A parameter and its full PyTorch-style name ("layers.0.weight"). The pointer is
// owned by the module it came from and stays valid as long as that module lives.
struct NamedParameter {
  std::string name;
  Parameter* param = nullptr;
};

// A buffer (state that is saved but not trained) and its full name.
struct NamedBuffer {
  std::string name;
  Tensor* buffer = nullptr;
};

// Returns p.grad, first creating it as zeros shaped like p.data when undefined, so a
// kernel can always add into it. A defined grad whose dtype, shape or device differ
// from the data's is an error naming `op` and `name`: adding into it would be wrong,
// and replacing it would break a bucket view.
Tensor& grad_for_accumulation(Parameter& p, const char* op, const std::string& name);
// The same for a kernel that can either write the gradient whole or add into it:
// `fresh` comes back true when p.grad was undefined, and p.grad is then uninitialised
// memory to overwrite (no zero-fill that the kernel would write over).
Tensor& grad_for_write(Parameter& p, const char* op, const std::string& name, bool& fresh);

}  // namespace troupe::nn
