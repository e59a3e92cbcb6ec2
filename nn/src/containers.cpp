#include "troupe/nn/containers.hpp"

#include "troupe/error.hpp"

namespace troupe::nn {

namespace {
[[noreturn]] void no_computation(const std::string& type, const char* what) {
  TROUPE_THROW(Error, type, ".", what, ": a container has no computation of its own; the module that owns it runs ",
               "its children");
}
}  // namespace

Tensor ModuleList::forward_impl(const Tensor&) { no_computation(type_name(), "forward"); }
Tensor ModuleList::backward_impl(const Tensor&) { no_computation(type_name(), "backward"); }
Tensor ModuleDict::forward_impl(const Tensor&) { no_computation(type_name(), "forward"); }
Tensor ModuleDict::backward_impl(const Tensor&) { no_computation(type_name(), "backward"); }

}  // namespace troupe::nn
