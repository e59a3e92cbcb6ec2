// Tensor: a dtype, a shape, a device and a view into shared storage.
//
// A tensor is always contiguous and row-major; views (reshape, slice along dim 0,
// select) share the storage and differ only in shape and element offset. That is
// all a training runtime needs to pack many tensors into one flat buffer, and it
// keeps every kernel a plain loop. Transposes are taken by matmul as flags instead
// of as strided views.
//
// Copying a Tensor copies the handle, not the bytes (as in PyTorch); `clone()`
// copies the bytes. Operations that make a new tensor return it; the ones that
// write into an existing tensor end in an underscore (`fill_`, `add_`).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/storage.hpp"

namespace troupe::tensor {

using Shape = std::vector<std::int64_t>;

// "[4, 3]"
std::string to_string(const Shape& shape);
std::int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  // An undefined tensor: no storage. `defined()` is false; most operations reject it.
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
  // [start, end) by step, as torch.arange.
  static Tensor arange(double start, double end, double step = 1, DType dtype = DType::i64,
                       Device device = Device::cpu());
  // Copies `values` into a new tensor; an empty `shape` means 1-D of values.size().
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape = {}, Device device = Device::cpu());
  // A view of existing storage; checks that the view fits.
  static Tensor from_storage(std::shared_ptr<Storage> storage, Shape shape, DType dtype, std::int64_t offset = 0);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  const Shape& shape() const { return shape_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  // Size of dimension d; negative d counts from the end.
  std::int64_t size(std::int64_t d) const;
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * element_size(dtype_); }
  std::size_t element_bytes() const { return element_size(dtype_); }
  // Offset of the first element in the storage, in elements.
  std::int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage_with(const Tensor& other) const { return storage_ && storage_ == other.storage_; }

  // Address of the first element (host or device).
  void* raw_data() const;
  // Typed host pointer; throws if T is not the dtype or the tensor is not on the CPU.
  template <class T>
  T* data() const;
  // Host copy of the elements as T (converting from the tensor's dtype).
  template <class T>
  std::vector<T> to_vector() const;
  // The single element of a one-element tensor, converted to double.
  double item() const;

  Tensor clone() const;
  // Copies src's elements into this tensor, converting dtype and crossing devices as
  // needed; element counts must match (shapes may differ, as with a flat buffer).
  Tensor& copy_(const Tensor& src);
  // From the meta device: the described values, computed (tensor/meta.hpp).
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;

  // Views. A -1 in reshape is inferred.
  Tensor reshape(Shape shape) const;
  Tensor view(Shape shape) const { return reshape(std::move(shape)); }
  Tensor flatten() const { return reshape({numel_}); }
  // Rows [begin, end) along dim 0.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  // Row i along dim 0, one dimension fewer.
  Tensor select(std::int64_t i) const;
  Tensor operator[](std::int64_t i) const { return select(i); }

  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0); }

  // Throws InvalidArgument naming `op` when undefined.
  void check_defined(const char* op) const;

 private:
  Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype, std::int64_t offset);

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  std::int64_t numel_ = 0;
  std::int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

// "Tensor(f32 [2, 3] cpu: 1, 2, 3, 4, 5, 6)", elided past a few elements.
std::ostream& operator<<(std::ostream& out, const Tensor& t);

// ---- template definitions ----

namespace detail {
void copy_host_to(const void* src, std::size_t nbytes, const Tensor& dst);
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape, Device device) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
  TROUPE_CHECK(shape_numel(shape) == static_cast<std::int64_t>(values.size()), "from_vector: ", values.size(),
               " values do not fill shape ", to_string(shape));
  Tensor t = empty(shape, dtype_of<T>, device);
  detail::copy_host_to(values.data(), values.size() * sizeof(T), t);
  return t;
}

template <class T>
T* Tensor::data() const {
  check_defined("data");
  TROUPE_CHECK(dtype_of<T> == dtype_, "data<", dtype_name(dtype_of<T>), ">: tensor is ", dtype_name(dtype_), " ",
               to_string(shape_));
  TROUPE_CHECK(device().is_cpu(), "data: tensor is on ", to_string(device()), "; use to(Device::cpu()) first");
  return static_cast<T*>(raw_data());
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu()).to(dtype_of<T>);
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

}  // namespace troupe::tensor

namespace troupe {
using tensor::Device;
using tensor::DType;
using tensor::Shape;
using tensor::Tensor;
}  // namespace troupe
