// tensor/cuda_math.hpp: the public switch over the backend's (cuda_loader.cpp forwards
// it to the plugin, or a static build links the real one).
#include "troupe/tensor/cuda_math.hpp"

#include "cuda_backend.hpp"

namespace troupe::tensor {

void set_cuda_allow_tf32(bool allow) { cuda_backend::set_allow_tf32(allow); }

bool cuda_allow_tf32() { return cuda_backend::allow_tf32(); }

}  // namespace troupe::tensor
