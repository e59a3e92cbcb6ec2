// tensor_bench: troupe's tensor kernels next to what they wrap or compete with.
//
//   matmul       troupe::tensor::matmul_out  vs  cblas_sgemm on the same buffers (GFLOP/s)
//   elementwise  add, add_, axpy_, scale_    vs  memcpy moving as many bytes (GB/s)
//   casts        dst.copy_(src) across dtypes vs memcpy moving as many bytes (GB/s)
//
// Every case is registered twice, as "<case>/troupe" and "<case>/baseline", one right
// after the other, so they are timed back to back and a busy spell on a shared machine
// slows both alike; the baseline's label says what it is. bench/run runs the program a
// few times, pairs the two by name, keeps the round with the median ratio and writes
// bench/results/tensor.json. Each benchmark reports one rate counter, "GFLOP/s" or
// "GB/s", counted the same way for both halves, so troupe / baseline is a speed ratio.
//
// Everything runs on one thread (troupe and OpenBLAS both pinned to 1), which is how a
// rank runs under mpirun on this machine and what makes the comparison fair.
#include <cblas.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/tensor/tensor.hpp"

namespace {

namespace tt = troupe::tensor;
using tt::DType;
using tt::Tensor;
using tt::Transpose;

// ---- registration helpers ----

using Body = std::function<void(benchmark::State&)>;

// Timed in CPU time, not wall time: every kernel here runs on the calling thread
// (OpenBLAS included, at one thread) and never blocks, so the two agree on an idle
// machine, and on a busy one CPU time leaves out the slices another process took.
void register_case(const std::string& name, const Body& body) {
  benchmark::RegisterBenchmark(name.c_str(), body)->Unit(benchmark::kMicrosecond);
}

// A rate counter: `per_iteration` units of work each iteration, shown per second. The
// work is given in giga-units so the counter reads directly as GFLOP/s or GB/s.
void set_rate(benchmark::State& state, const char* unit, double per_iteration_giga) {
  state.counters[unit] = benchmark::Counter(per_iteration_giga, benchmark::Counter::kIsIterationInvariantRate);
}

std::string human_bytes(std::int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MB";
  return std::to_string(bytes >> 10) + " KB";
}

// ---- shared buffers ----
//
// Both halves of a pair run on the very same tensors, made once per process: filling
// 64 MB costs more than timing it (every first touch of a page faults, ~10 us a page
// on a VM), and the same addresses rule out alignment as a cause of a difference.
// Each benchmark also runs its kernel once, untimed, before its loop: on the 2-core VM
// this was written on, the first pass over a 64 MB buffer right after another 64 MB
// block was freed took ~30 ms instead of ~3 (a cost of the hypervisor, not of the
// kernel), and that would be charged to whichever side of a pair happened to run next.

struct BufferKey {
  DType dtype;
  std::int64_t rows, cols;
  int slot;  // distinguishes tensors of the same shape used together (a, b, c)
  auto operator<=>(const BufferKey&) const = default;
};

Tensor& buffer(DType dtype, std::int64_t rows, std::int64_t cols, int slot) {
  static std::map<BufferKey, Tensor> cache;
  const BufferKey key{dtype, rows, cols, slot};
  auto it = cache.find(key);
  if (it == cache.end()) {
    tt::Generator gen(static_cast<std::uint64_t>(slot) + 1);
    Tensor t =
        tt::is_floating(dtype) ? tt::uniform({rows, cols}, -1, 1, gen, dtype) : Tensor::full({rows, cols}, 1, dtype);
    it = cache.emplace(key, std::move(t)).first;
  }
  return it->second;
}

// ---- matmul ----
//
// C[m, n] = op(A) op(B) with op a transpose when asked, row-major, as matmul_out takes it.
// flops = 2 m n k (one multiply and one add per term), the usual GEMM count.

struct Gemm {
  std::int64_t m, n, k;
  bool ta, tb;
  std::string what;  // where the shape comes from, shown after the dimensions

  Tensor& a() const { return ta ? buffer(DType::f32, k, m, 0) : buffer(DType::f32, m, k, 0); }
  Tensor& b() const { return tb ? buffer(DType::f32, n, k, 1) : buffer(DType::f32, k, n, 1); }
  Tensor& c() const { return buffer(DType::f32, m, n, 2); }
};

// The baseline: OpenBLAS called directly, with the arguments matmul_out derives.
void sgemm(const Gemm& g, const float* a, const float* b, float* c) {
  const auto m = static_cast<blasint>(g.m), n = static_cast<blasint>(g.n), k = static_cast<blasint>(g.k);
  cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
              g.ta ? m : k, b, g.tb ? k : n, 0.0f, c, n);
}

// "cblas_sgemm, OpenBLAS 0.3.21 Haswell": the version and the kernels it picked here.
std::string openblas_name() {
  std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 NO_LAPACKE ..."
  const auto first = config.find(' '), second = config.find(' ', first + 1);
  const std::string version = first == std::string::npos ? "" : config.substr(first + 1, second - first - 1);
  return "cblas_sgemm, OpenBLAS " + version + " " + openblas_get_corename();
}

void register_gemm(const Gemm& g) {
  const std::string name = "matmul " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) +
                           (g.what.empty() ? "" : " " + g.what);
  const double gflop = 2.0 * static_cast<double>(g.m * g.n * g.k) * 1e-9;
  const Transpose ta = g.ta ? Transpose::yes : Transpose::no, tb = g.tb ? Transpose::yes : Transpose::no;

  register_case(name + "/troupe", [g, gflop, ta, tb](benchmark::State& state) {
    Tensor &a = g.a(), &b = g.b(), &c = g.c();
    // Check once that the product is the library's, as nccl-tests verifies every size
    // it times: to f32 rounding (1e-5 of the largest element), since on a CPU with
    // AVX-512 troupe runs its own kernel, which sums in another order.
    Tensor expected = Tensor::zeros({g.m, g.n});
    sgemm(g, a.data<float>(), b.data<float>(), expected.data<float>());
    tt::matmul_out(c, a, b, ta, tb);
    float worst = 0, largest = 0;
    for (std::int64_t i = 0; i < g.m * g.n; ++i) {
      worst = std::max(worst, std::fabs(c.data<float>()[i] - expected.data<float>()[i]));
      largest = std::max(largest, std::fabs(expected.data<float>()[i]));
    }
    if (worst > 1e-5f * largest) state.SkipWithError("matmul_out differs from cblas_sgemm");
    for (auto _ : state) {
      tt::matmul_out(c, a, b, ta, tb);
      benchmark::ClobberMemory();
    }
    set_rate(state, "GFLOP/s", gflop);
  });
  register_case(name + "/baseline", [g, gflop](benchmark::State& state) {
    const float* a = g.a().data<float>();
    const float* b = g.b().data<float>();
    float* c = g.c().data<float>();
    sgemm(g, a, b, c);  // warm-up, untimed
    for (auto _ : state) {
      sgemm(g, a, b, c);
      benchmark::ClobberMemory();
    }
    set_rate(state, "GFLOP/s", gflop);
    state.SetLabel(openblas_name());
  });
}

void register_matmul() {
  for (std::int64_t s : {64, 128, 256, 512, 1024}) register_gemm({s, s, s, false, false, "square"});
  // Linear layers, a batch of B rows through in -> out: the 64-256-256-10 MLP of
  // examples/train_digits.cpp, and two wide layers where the weights dominate.
  struct Layer {
    std::int64_t batch, in, out;
  };
  for (const Layer& l :
       {Layer{64, 64, 256}, Layer{64, 256, 256}, Layer{64, 256, 10}, Layer{32, 1024, 4096}, Layer{32, 4096, 4096}}) {
    const std::string fc =
        "fc " + std::to_string(l.in) + "->" + std::to_string(l.out) + " batch " + std::to_string(l.batch);
    // forward  y[B, out] = x[B, in] W[out, in]^T
    register_gemm({l.batch, l.out, l.in, false, true, fc + " fwd x W^T"});
    // backward dW[out, in] = gy[B, out]^T x[B, in]
    register_gemm({l.out, l.in, l.batch, true, false, fc + " dW gy^T x"});
    // backward dx[B, in] = gy[B, out] W[out, in]
    register_gemm({l.batch, l.in, l.out, false, false, fc + " dx gy W"});
  }
}

// ---- elementwise and casts, against memcpy ----
//
// Bytes moved = bytes read + bytes written by the kernel: add reads two tensors and
// writes one (12 bytes per f32 element), scale_ reads and writes one (8). memcpy of
// N bytes moves 2N, so the baseline copies half the kernel's traffic and both report
// the same GB/s for the same time. memcpy is the ceiling for a streaming kernel: at
// 4 MB and up the ratio says how close to memory bandwidth a kernel runs, in cache it
// mostly says how well the loop vectorises.

constexpr std::int64_t kSizes[] = {4 << 10, 256 << 10, 4 << 20, 64 << 20};  // bytes per f32 tensor

// Slots in the buffer cache, apart so that one group's in-place kernels (add_ makes its
// target grow) never change the values another group reads (a cast of values past the
// f16 range would take the overflow shortcut).
constexpr int kElementwiseSlot = 10, kCastSlot = 20, kMemcpySlot = 30;

void register_memcpy_baseline(const std::string& name, std::int64_t bytes_moved) {
  register_case(name + "/baseline", [bytes_moved](benchmark::State& state) {
    const std::int64_t n = bytes_moved / 2;
    const void* src = buffer(DType::u8, 1, n, kMemcpySlot).raw_data();
    void* dst = buffer(DType::u8, 1, n, kMemcpySlot + 1).raw_data();
    std::memcpy(dst, src, static_cast<std::size_t>(n));  // warm-up, untimed
    for (auto _ : state) {
      std::memcpy(dst, src, static_cast<std::size_t>(n));
      benchmark::ClobberMemory();
    }
    set_rate(state, "GB/s", static_cast<double>(bytes_moved) * 1e-9);
    state.SetLabel("memcpy, same bytes moved");
  });
}

struct Elementwise {
  const char* op;
  int bytes_per_element;  // read + written
  void (*run)(Tensor& y, const Tensor& x);
};

void register_elementwise() {
  const Elementwise ops[] = {
      // add allocates its result: the first touch of a fresh buffer is part of its cost.
      {"add", 12, [](Tensor& y, const Tensor& x) { benchmark::DoNotOptimize(tt::add(y, x)); }},
      {"add_", 12, [](Tensor& y, const Tensor& x) { tt::add_(y, x); }},
      {"axpy_", 12, [](Tensor& y, const Tensor& x) { tt::axpy_(y, 1e-3, x); }},
      // alpha = 1 keeps the values fixed however many iterations run (no drift into
      // subnormals, which would time the FPU's slow path instead of the loop).
      {"scale_", 8, [](Tensor& y, const Tensor&) { tt::scale_(y, 1.0); }},
  };
  for (const auto& op : ops)
    for (std::int64_t bytes : kSizes) {
      const std::int64_t n = bytes / 4;
      const std::int64_t moved = n * op.bytes_per_element;
      const std::string name = std::string(op.op) + " f32 " + human_bytes(bytes);
      register_case(name + "/troupe", [op, n, moved](benchmark::State& state) {
        Tensor& y = buffer(DType::f32, 1, n, kElementwiseSlot);
        const Tensor& x = buffer(DType::f32, 1, n, kElementwiseSlot + 1);
        op.run(y, x);  // warm-up, untimed
        for (auto _ : state) {
          op.run(y, x);
          benchmark::ClobberMemory();
        }
        set_rate(state, "GB/s", static_cast<double>(moved) * 1e-9);
      });
      register_memcpy_baseline(name, moved);
    }
}

void register_casts() {
  struct Cast {
    DType from, to;
  };
  for (const Cast c : {Cast{DType::f32, DType::bf16}, Cast{DType::bf16, DType::f32}, Cast{DType::f32, DType::f16},
                       Cast{DType::f16, DType::f32}})
    for (std::int64_t bytes : kSizes) {
      const std::int64_t n = bytes / 4;  // sized by the f32 side
      const std::int64_t moved = n * static_cast<std::int64_t>(element_size(c.from) + element_size(c.to));
      const std::string name = "cast " + std::string(tt::dtype_name(c.from)) + "->" +
                               std::string(tt::dtype_name(c.to)) + " " + human_bytes(bytes) + " of f32";
      register_case(name + "/troupe", [c, n, moved](benchmark::State& state) {
        const Tensor& src = buffer(c.from, 1, n, kCastSlot);
        // A preallocated destination: to(DType) would time malloc and page faults too.
        Tensor& dst = buffer(c.to, 1, n, kCastSlot + 1);
        dst.copy_(src);  // warm-up, untimed
        for (auto _ : state) {
          dst.copy_(src);
          benchmark::ClobberMemory();
        }
        set_rate(state, "GB/s", static_cast<double>(moved) * 1e-9);
      });
      register_memcpy_baseline(name, moved);
    }
}

}  // namespace

int main(int argc, char** argv) {
  tt::set_num_threads(1);
  openblas_set_num_threads(1);

  // A short default so a bare `tensor_bench` finishes in about a minute; bench/run
  // passes its own --benchmark_min_time, which wins over this one.
  std::vector<char*> args(argv, argv + argc);
  bool has_min_time = false;
  for (char* a : args) has_min_time = has_min_time || std::strncmp(a, "--benchmark_min_time", 20) == 0;
  static char default_min_time[] = "--benchmark_min_time=0.1";
  if (!has_min_time) args.insert(args.begin() + 1, default_min_time);
  int args_count = static_cast<int>(args.size());

  register_matmul();
  register_elementwise();
  register_casts();

  benchmark::Initialize(&args_count, args.data());
  if (benchmark::ReportUnrecognizedArguments(args_count, args.data())) return 1;
  benchmark::AddCustomContext("openblas", openblas_get_config());
  benchmark::AddCustomContext("threads", "1 (troupe::tensor::set_num_threads, openblas_set_num_threads)");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
