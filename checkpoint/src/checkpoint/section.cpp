#include "troupe/checkpoint/section.hpp"

#include <algorithm>

namespace troupe::checkpoint {

namespace {
void check_name(std::string_view name, const std::string& group) {
  bool bad = name.empty() || name.front() == '/' || name.back() == '/' || name.find("//") != std::string_view::npos ||
             name == ".";
  if (bad)
    TROUPE_THROW(InvalidArgument, "checkpoint section ", group, ": '", name,
                 "' is not a usable tensor name (no leading, trailing or doubled '/')");
}
}  // namespace

SectionWriter::SectionWriter(Sink& file, std::string section) : file_(file), group_(std::string("/").append(section)) {
  file_.ensure_group(group_);
}

void SectionWriter::tensor(std::string_view name, const tensor::Tensor& t) {
  check_name(name, group_);
  file_.write_tensor(group_ + "/" + std::string(name), t);
}

void SectionWriter::attribute(std::string_view name, const AttrValue& value) {
  file_.set_attribute(group_, name, value);
}

SectionReader::SectionReader(const FileReader& file, std::string section)
    : file_(file), group_(std::string("/").append(section)) {
  if (!file_.has_group(group_)) TROUPE_THROW(FormatError, "checkpoint ", file_.path(), ": no section ", group_);
  infos_ = file_.tensors(group_);
  for (const TensorInfo& info : infos_) names_.push_back(info.path.substr(group_.size() + 1));
  attributes_ = file_.attributes(group_);
}

bool SectionReader::has_tensor(std::string_view name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

tensor::Tensor SectionReader::tensor(std::string_view name) const {
  if (!has_tensor(name))
    TROUPE_THROW(FormatError, "checkpoint ", file_.path(), ": section ", group_, " has no tensor '", name, "' (it has ",
                 names_.size(), ")");
  return file_.read(group_ + "/" + std::string(name));
}

void SectionReader::read_into(std::string_view name, const tensor::Tensor& dst) const {
  if (!has_tensor(name))
    TROUPE_THROW(FormatError, "checkpoint ", file_.path(), ": section ", group_, " has no tensor '", name, "' (it has ",
                 names_.size(), ")");
  file_.read_into(group_ + "/" + std::string(name), dst);
}

const TensorInfo& SectionReader::info(std::string_view name) const {
  checked_path(name);  // throws naming the file when absent
  return infos_[static_cast<std::size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin())];
}

tensor::Tensor SectionReader::read_range(std::string_view name, std::int64_t begin, std::int64_t end) const {
  return file_.read_range(checked_path(name), begin, end);
}

void SectionReader::read_range_into(std::string_view name, std::int64_t begin, const tensor::Tensor& dst) const {
  file_.read_range_into(checked_path(name), begin, dst);
}

std::string SectionReader::checked_path(std::string_view name) const {
  if (!has_tensor(name))
    TROUPE_THROW(FormatError, "checkpoint ", file_.path(), ": section ", group_, " has no tensor '", name, "' (it has ",
                 names_.size(), ")");
  return group_ + "/" + std::string(name);
}

namespace detail {

bool is_attribute_scalar(std::string_view name, const tensor::Tensor& t) {
  return t.defined() && t.dim() == 0 && name.find('/') == std::string_view::npos &&
         (t.dtype() == tensor::DType::f64 || t.dtype() == tensor::DType::i64);
}

AttrValue scalar_value(const tensor::Tensor& t) {
  tensor::Tensor host = t.to(tensor::Device::cpu());
  if (host.dtype() == tensor::DType::i64) return *host.data<std::int64_t>();
  return *host.data<double>();
}

tensor::Tensor scalar_tensor(const AttrValue& value) {
  // Through the data pointer, so an int64 past 2^53 or a NaN payload survives exactly.
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    tensor::Tensor t = tensor::Tensor::empty({}, tensor::DType::i64);
    *t.data<std::int64_t>() = *i;
    return t;
  }
  if (const auto* d = std::get_if<double>(&value)) {
    tensor::Tensor t = tensor::Tensor::empty({}, tensor::DType::f64);
    *t.data<double>() = *d;
    return t;
  }
  return {};
}

}  // namespace detail
}  // namespace troupe::checkpoint
