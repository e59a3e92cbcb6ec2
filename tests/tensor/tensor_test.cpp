#include <gtest/gtest.h>

#include <cereal/archives/binary.hpp>
#include <sstream>

#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/serialize.hpp"
#include "troupe/tensor/tensor.hpp"

using namespace troupe;
using namespace troupe::tensor;

namespace {
// Runs f, expects it to throw E, and returns the message for further checks.
template <class E = InvalidArgument, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}
}  // namespace

TEST(DType, NamesRoundTripAndAcceptPyTorchSpellings) {
  for (DType t : kAllDTypes) EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::bf16);
  EXPECT_EQ(dtype_from_name("float32"), DType::f32);
  EXPECT_NE(message_of([] { dtype_from_name("f8"); }).find("'f8'"), std::string::npos);
  EXPECT_EQ(element_size(DType::bf16), 2u);
  EXPECT_EQ(element_size(DType::i64), 8u);
}

TEST(Tensor, DefaultConstructedIsUndefinedAndSaysSo) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_NE(message_of([&] { t.clone(); }).find("undefined"), std::string::npos);
}

TEST(Tensor, FactoriesFillEveryDType) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(Tensor::zeros({2, 3}, t).to_vector<double>(), std::vector<double>(6, 0.0));
    EXPECT_EQ(Tensor::ones({4}, t).to_vector<double>(), std::vector<double>(4, 1.0));
    EXPECT_EQ(Tensor::full({2}, 3, t).to_vector<double>(), std::vector<double>(2, 3.0));
  }
  EXPECT_EQ(Tensor::arange(0, 5).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(1, 2, 0.25, DType::f32).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(Tensor::arange(3, 0, -1).numel(), 3);
  EXPECT_EQ(Tensor::zeros({0, 5}).numel(), 0);
  EXPECT_THROW(Tensor::empty({2, -1}), InvalidArgument);
}

TEST(Tensor, FromVectorChecksThatTheValuesFillTheShape) {
  const Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.size(-1), 3);
  const auto msg = message_of([] { Tensor::from_vector<float>({1, 2, 3}, {2, 2}); });
  EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;
}

TEST(Tensor, ViewsShareStorageAndOffsets) {
  Tensor flat = Tensor::arange(0, 12, 1, DType::f32);
  Tensor m = flat.reshape({3, -1});
  EXPECT_EQ(m.shape(), (Shape{3, 4}));
  EXPECT_TRUE(m.shares_storage_with(flat));
  Tensor rows = m.slice(1, 3);
  EXPECT_EQ(rows.offset(), 4);
  EXPECT_EQ(rows.to_vector<float>().front(), 4.0f);
  Tensor row = m[2];
  EXPECT_EQ(row.shape(), (Shape{4}));
  row.fill_(-1);
  EXPECT_EQ(flat.to_vector<float>()[8], -1.0f);  // writing through the view reaches the buffer
  // A view built from raw storage, the way gradient buckets will hold many tensors.
  Tensor second = Tensor::from_storage(flat.storage(), {2, 2}, DType::f32, 4);
  EXPECT_EQ(second.to_vector<float>(), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_THROW(Tensor::from_storage(flat.storage(), {4, 4}, DType::f32, 0), InvalidArgument);
}

TEST(Tensor, BadViewsNameTheOperationAndTheShapes) {
  const Tensor t = Tensor::zeros({3, 4});
  auto msg = message_of([&] { t.reshape({5, 2}); });
  EXPECT_NE(msg.find("reshape"), std::string::npos);
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos);
  EXPECT_NE(msg.find("[5, 2]"), std::string::npos);
  msg = message_of([&] { t.slice(2, 4); });
  EXPECT_NE(msg.find("slice"), std::string::npos);
  EXPECT_NE(msg.find("[2, 4)"), std::string::npos);
  EXPECT_THROW(t.select(3), InvalidArgument);
  EXPECT_THROW(t.reshape({-1, -1}), InvalidArgument);
  EXPECT_THROW(t.size(2), InvalidArgument);
}

TEST(Tensor, CloneCopiesTheBytes) {
  Tensor a = Tensor::ones({3});
  Tensor b = a.clone();
  b.fill_(2);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_FALSE(a.shares_storage_with(b));
}

TEST(Tensor, ConvertsBetweenEveryPairOfDTypes) {
  const Tensor src = Tensor::from_vector<double>({0, 1, 2, 100});
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      const Tensor converted = src.to(from).to(to);
      EXPECT_EQ(converted.dtype(), to);
      EXPECT_EQ(converted.to_vector<double>(), (std::vector<double>{0, 1, 2, 100})) << from << "->" << to;
    }
  // Rounding to bf16 keeps 8 significant bits.
  EXPECT_EQ(Tensor::full({1}, 257, DType::f32).to(DType::bf16).item(), 256.0);
}

TEST(Tensor, CopyIntoAViewConvertsAndChecksTheCount) {
  Tensor buffer = Tensor::zeros({10}, DType::f64);
  Tensor part = buffer.slice(2, 5);
  part.copy_(Tensor::from_vector<float>({1.5f, 2.5f, 3.5f}));
  EXPECT_EQ(buffer.to_vector<double>()[3], 2.5);
  const auto msg = message_of([&] { part.copy_(Tensor::ones({4})); });
  EXPECT_NE(msg.find("copy_"), std::string::npos);
}

TEST(Tensor, ItemNeedsExactlyOneElement) {
  EXPECT_EQ(Tensor::full({1, 1}, 7).item(), 7.0);
  EXPECT_THROW(Tensor::zeros({2}).item(), InvalidArgument);
}

TEST(Tensor, DataChecksTheDTypeAndDevice) {
  const Tensor t = Tensor::zeros({2}, DType::f64);
  EXPECT_NE(t.data<double>(), nullptr);
  const auto msg = message_of([&] { t.data<float>(); });
  EXPECT_NE(msg.find("f64"), std::string::npos);
}

TEST(Tensor, PrintsDTypeShapeDeviceAndFirstValues) {
  std::ostringstream out;
  out << Tensor::arange(0, 3, 1, DType::f32);
  EXPECT_EQ(out.str(), "Tensor(f32 [3] cpu: 0, 1, 2)");
}

TEST(Tensor, CudaWithoutAGpuIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  const auto msg = message_of([] { Tensor::zeros({2}, DType::f32, Device::cuda()); });
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  EXPECT_THROW(Tensor::ones({2}).to(Device::cuda()), InvalidArgument);
  EXPECT_EQ(device_from_string("cuda:1"), Device::cuda(1));
  EXPECT_THROW(device_from_string("tpu"), InvalidArgument);
}

TEST(Serialize, EveryDTypeRoundTripsThroughABinaryArchive) {
  for (DType t : kAllDTypes) {
    const Tensor original = Tensor::arange(0, 6, 1, t).reshape({2, 3});
    std::stringstream stream;
    {
      cereal::BinaryOutputArchive out(stream);
      out(original, Tensor());
    }
    Tensor loaded, undefined = Tensor::ones({1});
    cereal::BinaryInputArchive in(stream);
    in(loaded, undefined);
    EXPECT_TRUE(equal(original, loaded)) << t;
    EXPECT_FALSE(undefined.defined());
  }
}

TEST(Serialize, ATruncatedOrForgedMessageIsAFormatError) {
  std::stringstream stream;
  {
    cereal::BinaryOutputArchive out(stream);
    out(Tensor::ones({1000}));
  }
  const std::string bytes = stream.str();
  std::stringstream truncated(bytes.substr(0, bytes.size() / 2));
  Tensor t;
  EXPECT_ANY_THROW({
    cereal::BinaryInputArchive in(truncated);
    in(t);
  });
  std::string forged = bytes;
  forged[forged.find("f32")] = 'x';  // an unknown dtype name
  std::stringstream forged_stream(forged);
  cereal::BinaryInputArchive in(forged_stream);
  EXPECT_THROW(in(t), FormatError);
}
