// The UCI optical digits set (data/digits.csv.gz): 1797 8x8 images, 64 pixel
// values 0..16 and a label 0..9 per line. Loading checks every line and reports
// the file and line of anything malformed; splitting is seeded so every run (and
// every rank) sees the same train/test split.
#pragma once

#include <cstdint>
#include <string>

#include "troupe/tensor/tensor.hpp"

namespace troupe::examples {

struct Dataset {
  Tensor inputs;  // f32 [n, 64], scaled to [0, 1]
  Tensor labels;  // i64 [n]
  std::int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

struct DigitsSplit {
  Dataset train;
  Dataset test;
};

// Reads a CSV file, gzip-compressed or plain. Throws troupe::FormatError naming the
// file and line for malformed content, troupe::InvalidArgument for a missing file.
Dataset load_digits(const std::string& path);

// Shuffles with `seed` and holds out `test_fraction` of the rows.
DigitsSplit split_dataset(const Dataset& all, double test_fraction, std::uint64_t seed);

// Rows `indices[begin, end)` of `data`, copied into a contiguous batch.
Dataset gather_rows(const Dataset& data, const std::vector<std::int64_t>& indices, std::int64_t begin,
                    std::int64_t end);

}  // namespace troupe::examples
