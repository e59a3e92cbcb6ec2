// The meta device: a tensor described, not computed, materialised later -- in ranges,
// in other dtypes -- to exactly the bits the same calls write on the CPU.
#include <gtest/gtest.h>

#include <cstring>

#include "troupe/error.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/meta.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::tensor;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST(Meta, HoldsNoMemoryAndRefusesToBeRead) {
  const auto before = host_memory_stats().live_bytes;
  Tensor t = Tensor::empty({1 << 20, 1024}, DType::f32, Device::meta());  // 4 GiB described
  EXPECT_EQ(host_memory_stats().live_bytes, before);
  EXPECT_TRUE(is_meta(t));
  EXPECT_EQ(t.numel(), std::int64_t{1} << 30);
  EXPECT_EQ(to_string(t.device()), "meta");
  EXPECT_EQ(device_from_string("meta"), Device::meta());
  try {
    (void)t.raw_data();
    FAIL() << "raw_data on a meta tensor returned";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("meta device has no data"), std::string::npos) << e.what();
  }
  EXPECT_THROW(add(t, t), InvalidArgument);
  EXPECT_THROW(Tensor::zeros({4}).copy_(Tensor::zeros({4}, DType::f32, Device::meta())), InvalidArgument);
  EXPECT_THROW(Tensor::zeros({4}).to(Device::meta()), InvalidArgument);
}

TEST(Meta, MaterialisesTheBitsOfTheSameCallsOnTheCpu) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    Generator cpu_gen(7, 3), meta_gen(7, 3);
    const Tensor u = uniform({37, 5}, -0.5, 0.25, cpu_gen, dtype);
    const Tensor n = normal({1001}, 0.1, 0.02, cpu_gen, dtype);
    const Tensor mu = uniform({37, 5}, -0.5, 0.25, meta_gen, dtype, Device::meta());
    const Tensor mn = normal({1001}, 0.1, 0.02, meta_gen, dtype, Device::meta());
    EXPECT_EQ(meta_gen.offset(), cpu_gen.offset()) << "the generator advances as on the CPU";
    EXPECT_TRUE(same_bits(mu.to(Device::cpu()), u)) << dtype;
    EXPECT_TRUE(same_bits(mn.to(Device::cpu()), n)) << dtype;
    EXPECT_EQ(mu.to(Device::cpu()).shape(), u.shape());
    // Any range, as a shard would take it.
    for (std::int64_t begin : {0, 1, 3, 4, 500, 997}) {
      const std::int64_t end = std::min<std::int64_t>(begin + 250, 1001);
      Tensor part = Tensor::empty({end - begin}, dtype);
      materialize_into(part, mn, begin);
      EXPECT_TRUE(same_bits(part, n.slice(begin, end))) << dtype << " [" << begin << ", " << end << ")";
    }
  }
}

TEST(Meta, ConvertsAsCopyWouldAndDescribesConstants) {
  Generator cpu_gen(11), meta_gen(11);
  const Tensor bf = normal({300}, 0, 1, cpu_gen, DType::bf16);
  const Tensor mbf = normal({300}, 0, 1, meta_gen, DType::bf16, Device::meta());
  Tensor wide = Tensor::empty({300}, DType::f32);
  materialize_into(wide, mbf, 0);  // rounded to bf16 first, as a bf16 model cast to f32 masters
  EXPECT_TRUE(same_bits(wide, bf.to(DType::f32)));

  Tensor ones = Tensor::ones({6}, DType::f32, Device::meta());
  EXPECT_TRUE(same_bits(ones.to(Device::cpu()), Tensor::ones({6})));
  Tensor w = normal({8}, 0, 1, meta_gen, DType::f32, Device::meta());
  w.zero_();  // a later initialiser replaces the description
  EXPECT_TRUE(same_bits(w.to(Device::cpu()), Tensor::zeros({8})));
  EXPECT_TRUE(same_bits(Tensor::full({3}, 2.5, DType::f64, Device::meta()).to(Device::cpu()),
                        Tensor::full({3}, 2.5, DType::f64)));
  // Large enough to stage in blocks when converting.
  Generator big_cpu(5), big_meta(5);
  const Tensor big = uniform({(1 << 20) + 77}, 0, 1, big_cpu, DType::bf16);
  const Tensor mbig = uniform({(1 << 20) + 77}, 0, 1, big_meta, DType::bf16, Device::meta());
  Tensor big_wide = Tensor::empty({(1 << 20) + 77}, DType::f64);
  materialize_into(big_wide, mbig, 0);
  EXPECT_TRUE(same_bits(big_wide, big.to(DType::f64)));
}

TEST(Meta, RefusesWhatItCannotDescribe) {
  Tensor never = Tensor::empty({4, 4}, DType::f32, Device::meta());
  try {
    (void)never.to(Device::cpu());
    FAIL() << "an undescribed meta tensor materialised";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("never initialised"), std::string::npos) << e.what();
  }
  Tensor whole = Tensor::zeros({10}, DType::f32, Device::meta());
  EXPECT_THROW(whole.slice(2, 5).fill_(1), InvalidArgument);  // part of a storage
  Generator gen(1);
  Tensor part = whole.slice(0, 5);
  EXPECT_THROW(normal_(part, 0, 1, gen), InvalidArgument);
  Tensor dst = Tensor::empty({4});
  EXPECT_THROW(materialize_into(dst, whole, 8), InvalidArgument);                // past the end
  EXPECT_THROW(materialize_into(dst, whole, -1), InvalidArgument);               // before the start
  EXPECT_THROW(materialize_into(dst, Tensor::zeros({10}), 0), InvalidArgument);  // not meta
  // A view at an offset materialises its own elements.
  Generator a(9), b(9);
  const Tensor cpu = uniform({10}, 0, 1, a);
  const Tensor meta = uniform({10}, 0, 1, b, DType::f32, Device::meta());
  EXPECT_TRUE(same_bits(meta.slice(4, 9).to(Device::cpu()), cpu.slice(4, 9).clone()));
}
