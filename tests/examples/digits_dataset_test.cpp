#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "digits_dataset.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;

namespace {
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::string valid_row(int label) {
  std::string row;
  for (int p = 0; p < 64; ++p) row += std::to_string(p % 17) + ",";
  return row + std::to_string(label) + "\n";
}

std::string message_of(const std::string& path) {
  try {
    examples::load_digits(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(Digits, LoadsTheShippedDataSet) {
  const examples::Dataset all = examples::load_digits(TROUPE_DIGITS_PATH);
  EXPECT_EQ(all.size(), 1797);
  EXPECT_EQ(all.inputs.shape(), (Shape{1797, 64}));
  EXPECT_EQ(tensor::max(all.inputs).item(), 1.0);  // 16 scaled to 1
  EXPECT_EQ(tensor::min(all.labels).item(), 0.0);
  EXPECT_EQ(tensor::max(all.labels).item(), 9.0);
}

TEST(Digits, TheSplitIsSeededDisjointAndComplete) {
  const examples::Dataset all = examples::load_digits(TROUPE_DIGITS_PATH);
  const auto a = examples::split_dataset(all, 0.2, 7), b = examples::split_dataset(all, 0.2, 7);
  EXPECT_EQ(a.test.size(), 359);
  EXPECT_EQ(a.train.size() + a.test.size(), all.size());
  EXPECT_TRUE(tensor::equal(a.train.inputs, b.train.inputs));
  const auto c = examples::split_dataset(all, 0.2, 8);
  EXPECT_FALSE(tensor::equal(a.train.labels, c.train.labels));
}

TEST(Digits, MalformedLinesNameTheFileLineAndProblem) {
  auto msg = message_of(write_file("short.csv", valid_row(1) + "1,2,3\n"));
  EXPECT_NE(msg.find("short.csv:2: found 3 fields"), std::string::npos) << msg;
  msg = message_of(write_file("label.csv", valid_row(1) + valid_row(12)));
  EXPECT_NE(msg.find("label.csv:2: label is 12"), std::string::npos) << msg;
  msg = message_of(write_file("pixel.csv", std::string("17,") + valid_row(3).substr(2)));
  EXPECT_NE(msg.find("pixel.csv:1: pixel 1 is 17"), std::string::npos) << msg;
  msg = message_of(write_file("long.csv", valid_row(1).substr(0, valid_row(1).size() - 1) + ",5\n"));
  EXPECT_NE(msg.find("more than 65 fields"), std::string::npos) << msg;
  msg = message_of(write_file("empty.csv", ""));
  EXPECT_NE(msg.find("no data rows"), std::string::npos) << msg;
  msg = message_of("/no/such/file.csv");
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}
