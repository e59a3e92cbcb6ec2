#include "troupe/train/best_model_keeper.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cereal/archives/binary.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "troupe/actors/detail/serialization.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/serialize.hpp"

namespace troupe::train {

namespace {
constexpr const char* kMagic = "troupe-best-model";
constexpr std::uint32_t kVersion = 1;

Tensor f64(double v) { return Tensor::full({}, v, DType::f64); }
}  // namespace

BestModelKeeper::BestModelKeeper(std::string metric, std::string mode, std::string path)
    : metric_(std::move(metric)), maximise_(mode == "max"), path_(std::move(path)) {
  TROUPE_CHECK(!metric_.empty(), "BestModelKeeper: the metric name is empty");
  TROUPE_CHECK(mode == "min" || mode == "max", "BestModelKeeper: mode must be \"min\" or \"max\", got \"", mode, "\"");
}

double BestModelKeeper::best_value() const {
  TROUPE_CHECK(best_.has_value(), "BestModelKeeper: no value of '", metric_, "' seen yet");
  return *best_;
}

bool BestModelKeeper::update(const Metrics& metrics, const nn::StateDict& state, std::int64_t step) {
  const double* value = nullptr;
  std::string present;
  for (const auto& [name, v] : metrics) {
    if (name == metric_) value = &v;
    present += (present.empty() ? "" : ", ") + name;
  }
  TROUPE_CHECK(value != nullptr, "BestModelKeeper: metric '", metric_, "' is not among the metrics (",
               present.empty() ? "none" : present, ")");
  if (std::isnan(*value)) return false;
  const bool better = !best_ || (maximise_ ? *value > *best_ : *value < *best_);
  if (!better) return false;
  nn::StateDict copy;
  for (const auto& [name, tensor] : state) copy.insert(name, tensor.clone());
  best_state_ = std::move(copy);
  best_ = *value;
  best_step_ = step;
  if (!path_.empty()) write_file();
  return true;
}

void BestModelKeeper::write_file() const {
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TROUPE_CHECK(out.good(), "BestModelKeeper: cannot open '", tmp, "' for writing: ", std::strerror(errno));
    cereal::BinaryOutputArchive archive(out);
    archive(std::string(kMagic), kVersion, metric_, std::string(maximise_ ? "max" : "min"), *best_, best_step_);
    archive(static_cast<std::uint64_t>(best_state_.size()));
    for (const auto& [name, tensor] : best_state_) archive(name, tensor);
    out.flush();
    TROUPE_CHECK(out.good(), "BestModelKeeper: writing '", tmp, "' failed: ", std::strerror(errno));
  }
  // fsync before the rename, so a crash leaves the old file or the whole new one.
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  TROUPE_CHECK(fd >= 0 && ::fsync(fd) == 0, "BestModelKeeper: fsync of '", tmp, "' failed: ", std::strerror(errno));
  ::close(fd);
  TROUPE_CHECK(std::rename(tmp.c_str(), path_.c_str()) == 0, "BestModelKeeper: renaming '", tmp, "' to '", path_,
               "' failed: ", std::strerror(errno));
}

BestModelFile BestModelKeeper::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TROUPE_CHECK(in.good(), "BestModelKeeper::load_file: cannot open '", path, "': ", std::strerror(errno));
  // Read whole and parsed with every length bounded by the file's size, so a corrupt
  // length prefix is a FormatError rather than a huge allocation.
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  BestModelFile file;
  try {
    actors::detail::SpanInputArchive archive(bytes);
    std::string magic;
    std::uint32_t version = 0;
    archive(magic);
    if (magic != kMagic)
      TROUPE_THROW(FormatError, "'", path, "' is not a troupe best-model file (magic '", magic, "')");
    archive(version);
    if (version != kVersion)
      TROUPE_THROW(FormatError, "'", path, "' has format version ", version, ", this build reads ", kVersion);
    std::uint64_t count = 0;
    archive(file.metric, file.mode, file.value, file.step, count);
    for (std::uint64_t i = 0; i < count; ++i) {
      std::string name;
      Tensor tensor;
      archive(name, tensor);
      file.state.insert(std::move(name), std::move(tensor));
    }
  } catch (const FormatError&) {
    throw;
  } catch (const std::exception& e) {  // cereal: truncated or corrupt
    TROUPE_THROW(FormatError, "'", path, "' is truncated or corrupt: ", e.what());
  }
  return file;
}

nn::StateDict BestModelKeeper::state_dict() const {
  nn::StateDict dict;
  dict.insert("maximise", f64(maximise_ ? 1 : 0));
  dict.insert("value", f64(best_ ? *best_ : NAN));
  dict.insert("step", Tensor::full({}, static_cast<double>(best_step_), DType::i64));
  return dict;
}

void BestModelKeeper::load_state_dict(const nn::StateDict& dict) {
  const bool maximise = dict.at("maximise").item() != 0;
  TROUPE_CHECK(maximise == maximise_, "BestModelKeeper::load_state_dict: the state is for mode ",
               maximise ? "max" : "min", ", this keeper uses ", maximise_ ? "max" : "min");
  const double value = dict.at("value").item();
  best_ = std::isnan(value) ? std::nullopt : std::optional<double>(value);
  best_step_ = static_cast<std::int64_t>(dict.at("step").item());
}

}  // namespace troupe::train
