#include "digits_dataset.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::examples {

namespace {

constexpr int kPixels = 64;
constexpr int kMaxPixel = 16;
constexpr int kClasses = 10;

// Parses one line of 65 integers into pixels and label, or says what is wrong.
std::string parse_line(const char* line, float* pixels, std::int64_t* label) {
  const char* p = line;
  for (int field = 0; field <= kPixels; ++field) {
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(p, &end, 10);
    if (end == p || errno != 0)
      return detail::concat("field ", field + 1, " is not an integer (expected 65 comma-separated integers)");
    if (field < kPixels) {
      if (value < 0 || value > kMaxPixel)
        return detail::concat("pixel ", field + 1, " is ", value, ", outside 0..", kMaxPixel);
      pixels[field] = static_cast<float>(value) / kMaxPixel;
    } else {
      if (value < 0 || value >= kClasses) return detail::concat("label is ", value, ", outside 0..", kClasses - 1);
      *label = value;
    }
    p = end;
    while (*p == ' ' || *p == '\r' || *p == '\n') ++p;
    if (field < kPixels) {
      if (*p != ',') return detail::concat("found ", field + 1, " fields, expected 65 comma-separated integers");
      ++p;
    }
  }
  if (*p != '\0') return "more than 65 fields, expected 65 comma-separated integers";
  return {};
}

}  // namespace

Dataset load_digits(const std::string& path) {
  if (!std::filesystem::exists(path)) TROUPE_THROW(InvalidArgument, "digits data file '", path, "' does not exist");
  // gzopen reads plain files too, so either form works.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) TROUPE_THROW(InvalidArgument, "cannot open digits data file '", path, "': ", std::strerror(errno));
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  char line[4096];
  std::int64_t line_number = 0;
  while (gzgets(file.get(), line, sizeof line) != nullptr) {
    ++line_number;
    if (std::strchr(line, '\n') == nullptr) {  // a last line without newline, a cut-off file, or a long line
      int zerr = Z_OK;
      const char* message = gzerror(file.get(), &zerr);
      if (zerr != Z_OK)
        TROUPE_THROW(FormatError, path, ":", line_number, ": compressed data is corrupt or truncated (", message, ")");
      if (!gzeof(file.get()))
        TROUPE_THROW(FormatError, path, ":", line_number, ": line longer than ", sizeof line - 1, " bytes");
    }
    if (line[0] == '\n' || line[0] == '\0') continue;
    float row[kPixels];
    std::int64_t label = 0;
    const std::string problem = parse_line(line, row, &label);
    if (!problem.empty()) TROUPE_THROW(FormatError, path, ":", line_number, ": ", problem);
    pixels.insert(pixels.end(), row, row + kPixels);
    labels.push_back(label);
  }
  int zerr = Z_OK;
  const char* message = gzerror(file.get(), &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END)
    TROUPE_THROW(FormatError, path, ":", line_number, ": compressed data is corrupt or truncated (", message, ")");
  if (labels.empty()) TROUPE_THROW(FormatError, path, ": no data rows");
  const auto n = static_cast<std::int64_t>(labels.size());
  return {Tensor::from_vector(pixels, {n, kPixels}), Tensor::from_vector(labels)};
}

DigitsSplit split_dataset(const Dataset& all, double test_fraction, std::uint64_t seed) {
  TROUPE_CHECK(test_fraction > 0 && test_fraction < 1, "split_dataset: test fraction must be in (0, 1), got ",
               test_fraction);
  std::vector<std::int64_t> order(static_cast<std::size_t>(all.size()));
  std::iota(order.begin(), order.end(), 0);
  // Fisher-Yates with mt19937_64, whose output the standard fixes bit for bit (unlike
  // std::shuffle's use of it), so the split is the same with every compiler.
  std::mt19937_64 rng(seed);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  const auto n_test = static_cast<std::int64_t>(static_cast<double>(all.size()) * test_fraction);
  const auto n_train = all.size() - n_test;
  return {gather_rows(all, order, 0, n_train), gather_rows(all, order, n_train, all.size())};
}

Dataset gather_rows(const Dataset& data, const std::vector<std::int64_t>& indices, std::int64_t begin,
                    std::int64_t end) {
  const auto width = data.inputs.size(1);
  Tensor inputs = Tensor::empty({end - begin, width});
  Tensor labels = Tensor::empty({end - begin}, DType::i64);
  const float* x = data.inputs.data<float>();
  const std::int64_t* y = data.labels.data<std::int64_t>();
  float* xo = inputs.data<float>();
  std::int64_t* yo = labels.data<std::int64_t>();
  for (std::int64_t r = begin; r < end; ++r) {
    const auto src = indices[static_cast<std::size_t>(r)];
    std::copy_n(x + src * width, width, xo + (r - begin) * width);
    yo[r - begin] = y[src];
  }
  return {inputs, labels};
}

}  // namespace troupe::examples
