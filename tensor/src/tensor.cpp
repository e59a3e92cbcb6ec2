#include "troupe/tensor/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <sstream>

#include "convert.hpp"
#include "cuda/cuda_backend.hpp"
#include "troupe/tensor/meta.hpp"

namespace troupe::tensor {

std::string to_string(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace detail {

void copy_host_to(const void* src, std::size_t nbytes, const Tensor& dst) {
  if (nbytes == 0) return;
  if (dst.device().is_cpu())
    std::memcpy(dst.raw_data(), src, nbytes);
  else
    cuda_backend::copy(dst.raw_data(), src, nbytes, cuda_backend::CopyKind::host_to_device);
}

}  // namespace detail

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype, std::int64_t offset)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)),
      offset_(offset),
      dtype_(dtype) {}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) TROUPE_CHECK(d >= 0, "empty: negative dimension in shape ", to_string(shape));
  const auto n = shape_numel(shape);
  return Tensor(Storage::allocate(static_cast<std::size_t>(n) * element_size(dtype), device), shape, dtype, 0);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return empty(shape, dtype, device).fill_(0); }

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return empty(shape, dtype, device).fill_(1); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  return empty(shape, dtype, device).fill_(value);
}

Tensor Tensor::arange(double start, double end, double step, DType dtype, Device device) {
  TROUPE_CHECK(step != 0, "arange: step must be non-zero");
  TROUPE_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
               "arange: start, end and step must be finite, got ", start, ", ", end, ", ", step);
  const auto n = static_cast<std::int64_t>(std::max(0.0, std::ceil((end - start) / step)));
  Tensor host = empty({n}, dtype);
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = host.data<T>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = detail::convert<T>(start + static_cast<double>(i) * step);
  });
  return host.to(device);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, Shape shape, DType dtype, std::int64_t offset) {
  TROUPE_CHECK(storage != nullptr, "from_storage: null storage");
  const auto n = shape_numel(shape);
  const auto needed = static_cast<std::size_t>(offset + n) * element_size(dtype);
  TROUPE_CHECK(offset >= 0 && needed <= storage->nbytes(), "from_storage: a ", dtype_name(dtype), " view ",
               to_string(shape), " at element offset ", offset, " needs ", needed, " bytes, storage has ",
               storage->nbytes());
  return Tensor(std::move(storage), std::move(shape), dtype, offset);
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

std::int64_t Tensor::size(std::int64_t d) const {
  const auto nd = dim();
  TROUPE_CHECK(d >= -nd && d < nd, "size: dimension ", d, " out of range for shape ", to_string(shape_));
  return shape_[static_cast<std::size_t>(d < 0 ? d + nd : d)];
}

void* Tensor::raw_data() const {
  check_defined("raw_data");
  if (storage_->device().is_meta())
    TROUPE_THROW(InvalidArgument, "a ", dtype_name(dtype_), " ", to_string(shape_),
                 " tensor on the meta device has no data: materialise it first (tensor::materialize)");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(element_size(dtype_));
}

void Tensor::check_defined(const char* op) const {
  TROUPE_CHECK(defined(), op, ": tensor is undefined (default-constructed or moved from)");
}

double Tensor::item() const {
  check_defined("item");
  TROUPE_CHECK(numel_ == 1, "item: tensor has ", numel_, " elements, shape ", to_string(shape_));
  return to_vector<double>()[0];
}

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor out = empty(shape_, dtype_, device());
  out.copy_(*this);
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_defined("copy_");
  src.check_defined("copy_");
  TROUPE_CHECK(numel_ == src.numel_, "copy_: destination ", to_string(shape_), " has ", numel_, " elements, source ",
               to_string(src.shape_), " has ", src.numel_);
  if (numel_ == 0 || (storage_ == src.storage_ && offset_ == src.offset_ && dtype_ == src.dtype_)) return *this;
  const Device from = src.device(), to = device();
  TROUPE_CHECK(!from.is_meta() && !to.is_meta(), "copy_: a ", to_string(src.shape_), " tensor from ", from, " to ", to,
               ": the meta device holds no data (tensor::materialize_into computes a meta tensor's values)");
  using cuda_backend::CopyKind;
  if (from.is_cpu() && to.is_cpu()) {
    if (dtype_ == src.dtype_)
      std::memmove(raw_data(), src.raw_data(), nbytes());
    else
      detail::cast_host(src.raw_data(), src.dtype_, raw_data(), dtype_, numel_);
  } else if (from.is_cuda() && to.is_cuda()) {
    if (dtype_ == src.dtype_)
      cuda_backend::copy(raw_data(), src.raw_data(), nbytes(), CopyKind::device_to_device);
    else
      cuda_backend::cast(src.raw_data(), src.dtype_, raw_data(), dtype_, numel_);
  } else if (from.is_cpu()) {  // host -> device: convert on the host, then one transfer
    const Tensor staged = dtype_ == src.dtype_ ? src : src.to(dtype_);
    cuda_backend::copy(raw_data(), staged.raw_data(), nbytes(), CopyKind::host_to_device);
  } else {  // device -> host: one transfer, then convert on the host
    if (dtype_ == src.dtype_) {
      cuda_backend::copy(raw_data(), src.raw_data(), nbytes(), CopyKind::device_to_host);
    } else {
      Tensor staged = empty(src.shape_, src.dtype_);
      cuda_backend::copy(staged.raw_data(), src.raw_data(), src.nbytes(), CopyKind::device_to_host);
      detail::cast_host(staged.raw_data(), src.dtype_, raw_data(), dtype_, numel_);
    }
  }
  return *this;
}

Tensor Tensor::to(Device target) const {
  check_defined("to");
  if (target == device()) return *this;
  if (device().is_meta()) return materialize(*this, target);  // the described values
  Tensor out = empty(shape_, dtype_, target);
  return out.copy_(*this);
}

Tensor Tensor::to(DType target) const {
  check_defined("to");
  if (target == dtype_) return *this;
  Tensor out = empty(shape_, target, device());
  return out.copy_(*this);
}

Tensor Tensor::reshape(Shape shape) const {
  check_defined("reshape");
  std::int64_t known = 1;
  int inferred = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TROUPE_CHECK(inferred < 0, "reshape: more than one -1 in ", to_string(shape));
      inferred = static_cast<int>(i);
    } else {
      TROUPE_CHECK(shape[i] >= 0, "reshape: negative dimension in ", to_string(shape));
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    TROUPE_CHECK(known != 0 && numel_ % known == 0, "reshape: cannot infer -1 in ", to_string(shape), " for ", numel_,
                 " elements of ", to_string(shape_));
    shape[static_cast<std::size_t>(inferred)] = numel_ / known;
  }
  TROUPE_CHECK(shape_numel(shape) == numel_, "reshape: ", to_string(shape_), " (", numel_, " elements) cannot become ",
               to_string(shape));
  return Tensor(storage_, std::move(shape), dtype_, offset_);
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  check_defined("slice");
  TROUPE_CHECK(dim() >= 1, "slice: needs at least one dimension, tensor is 0-dim");
  const auto rows = shape_[0];
  TROUPE_CHECK(0 <= begin && begin <= end && end <= rows, "slice: rows [", begin, ", ", end,
               ") out of range for shape ", to_string(shape_));
  Shape shape = shape_;
  shape[0] = end - begin;
  const auto row = rows == 0 ? 0 : numel_ / rows;
  return Tensor(storage_, std::move(shape), dtype_, offset_ + begin * row);
}

Tensor Tensor::select(std::int64_t i) const {
  check_defined("select");
  TROUPE_CHECK(dim() >= 1, "select: needs at least one dimension, tensor is 0-dim");
  TROUPE_CHECK(0 <= i && i < shape_[0], "select: index ", i, " out of range for shape ", to_string(shape_));
  Shape shape(shape_.begin() + 1, shape_.end());
  const auto row = shape_numel(shape);
  return Tensor(storage_, std::move(shape), dtype_, offset_ + i * row);
}

Tensor& Tensor::fill_(double value) {
  check_defined("fill_");
  if (device().is_meta()) {
    detail::describe_meta_fill(*this, {MetaFill::Kind::constant, value, 0, 0, 0}, "fill_");
    return *this;
  }
  if (numel_ == 0) return *this;
  if (device().is_cuda()) {
    cuda_backend::fill(raw_data(), dtype_, numel_, value);
    return *this;
  }
  dispatch(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T v = detail::convert<T>(value);
    T* p = static_cast<T*>(raw_data());
    for (std::int64_t i = 0; i < numel_; ++i) p[i] = v;
  });
  return *this;
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  if (!t.defined()) return out << "Tensor(undefined)";
  out << "Tensor(" << t.dtype() << ' ' << to_string(t.shape()) << ' ' << t.device() << ':';
  constexpr std::int64_t kShown = 8;
  const auto values = t.flatten().slice(0, std::min(t.numel(), kShown)).to_vector<double>();
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : " ") << values[i];
  if (t.numel() > kShown) out << ", ...";
  return out << ')';
}

}  // namespace troupe::tensor
