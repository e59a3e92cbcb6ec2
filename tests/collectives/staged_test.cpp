// The staged backend: host buffers go straight to MPI (runs everywhere); CUDA buffers
// go through host copies and must give what the same call gives on host buffers, bit
// for bit, at any number of ranks on any number of devices, two ranks sharing one GPU
// included (skipped without a CUDA device).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test_world.hpp"
#include "troupe/collectives/staged_communicator.hpp"
#include "troupe/tensor/tensor.hpp"

// A namespace of its own: the unity build joins this file with the other tests'.
namespace troupe::collectives::testing::staged {
namespace {

using tensor::Device;
using tensor::Tensor;

std::unique_ptr<StagedCommunicator> staged_world() {
  return std::make_unique<StagedCommunicator>(std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, test_options()));
}

TEST(Staged, HostBuffersGoStraightToTheHostBackendAndSplitStaysStaged) {
  auto comm = staged_world();
  EXPECT_EQ(comm->backend(), "staged");
  EXPECT_EQ(comm->host_backend(), "mpi");
  const int n = comm->size(), r = comm->rank();
  std::vector<double> values{1.0 + r, 2.0};
  const auto before = comm->next_sequence();
  comm->allreduce(Buffer(values));
  EXPECT_EQ(values, (std::vector<double>{n * (n + 1) / 2.0, 2.0 * n}));
  EXPECT_EQ(comm->next_sequence(), before + 1);
  std::vector<float> one{static_cast<float>(r)}, all(static_cast<std::size_t>(n));
  comm->allgather_async(Buffer(one), Buffer(all)).wait();
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], static_cast<float>(i));

  std::unique_ptr<Communicator> half = comm->split(r % 2, r);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->backend(), "staged");
  EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
  std::vector<int> ones{1};
  half->allreduce(Buffer(ones));
  EXPECT_EQ(ones[0], half->size());
  EXPECT_EQ(comm->split(-1, 0), nullptr);
}

// Element i of rank r's data: small integers, exact in bf16 and in every sum here.
Tensor data_of(std::int64_t count, int rank, tensor::DType dtype, Device device, int offset = 0) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % 7) + rank + offset);
  return Tensor::from_vector(v).to(dtype).to(device);
}

std::vector<float> values_of(const Tensor& t) { return t.to(Device::cpu()).to(tensor::DType::f32).to_vector<float>(); }

// One call on `device`; returns what the call defines there (an in-place
// reduce_scatter's own block, a gather's output on the root).
using Call = std::function<std::vector<float>(Communicator&, tensor::DType, Device)>;

std::vector<std::pair<std::string, Call>> calls() {
  constexpr std::int64_t c = 1001;
  const auto zeros = [](std::int64_t count, tensor::DType dtype, Device device) {
    return Tensor::zeros({count}, dtype, device);
  };
  return {
      {"allreduce in place",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor t = data_of(c, m.rank(), d, dev);
         m.allreduce(Buffer(t));
         return values_of(t);
       }},
      {"allreduce max",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor in = data_of(c, m.rank(), d, dev), out = zeros(c, d, dev);
         m.allreduce(Buffer(in), Buffer(out), ReduceOp::max);
         return values_of(out);
       }},
      {"broadcast from the last rank",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor t = data_of(c, m.rank(), d, dev);
         m.broadcast(Buffer(t), m.size() - 1);
         return values_of(t);
       }},
      {"reduce to rank 0, the others' outputs untouched",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor in = data_of(c, m.rank(), d, dev), out = Tensor::full({c}, 7, d, dev);
         m.reduce(Buffer(in), Buffer(out), 0);
         return values_of(out);
       }},
      {"allgather in place",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor t = zeros(c * m.size(), d, dev);
         t.slice(c * m.rank(), c * (m.rank() + 1)).copy_(data_of(c, m.rank(), d, dev));
         m.allgather(Buffer(t));
         return values_of(t);
       }},
      {"allgather",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor in = data_of(c, m.rank(), d, dev), out = zeros(c * m.size(), d, dev);
         m.allgather(Buffer(in), Buffer(out));
         return values_of(out);
       }},
      {"reduce_scatter in place",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor t = data_of(c * m.size(), m.rank(), d, dev);
         m.reduce_scatter(Buffer(t));
         return values_of(t.slice(c * m.rank(), c * (m.rank() + 1)));
       }},
      {"reduce_scatter",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor in = data_of(c * m.size(), m.rank(), d, dev), out = zeros(c, d, dev);
         m.reduce_scatter(Buffer(in), Buffer(out));
         return values_of(out);
       }},
      {"gather to rank 0",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor in = data_of(c, m.rank(), d, dev);
         Tensor out = m.rank() == 0 ? zeros(c * m.size(), d, dev) : Tensor();
         m.gather(Buffer(in), m.rank() == 0 ? Buffer(out) : Buffer(), 0);
         return m.rank() == 0 ? values_of(out) : std::vector<float>{};
       }},
      {"scatter from rank 0",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor in = m.rank() == 0 ? data_of(c * m.size(), 0, d, dev) : Tensor(), out = zeros(c, d, dev);
         m.scatter(m.rank() == 0 ? Buffer(in) : Buffer(), Buffer(out), 0);
         return values_of(out);
       }},
      {"a ring of sends and receives, posted receive first",
       [=](Communicator& m, tensor::DType d, Device dev) {
         const int n = m.size(), r = m.rank();
         Tensor in = data_of(c, r, d, dev), out = zeros(c, d, dev);
         if (n == 1) return values_of(in);  // one rank has no peer
         Work got = m.recv_async(Buffer(out), (r + n - 1) % n, 3);
         Work sent = m.send_async(Buffer(in), (r + 1) % n, 3);
         sent.wait();
         got.wait();
         return values_of(out);
       }},
      {"async calls, a host one between, completing in order",
       [=](Communicator& m, tensor::DType d, Device dev) {
         Tensor a = data_of(c, m.rank(), d, dev), b = data_of(c, m.rank(), d, dev, 1);
         Work first = m.allreduce_async(Buffer(a));
         std::vector<float> flag{static_cast<float>(m.rank())};
         m.allreduce(Buffer(flag), ReduceOp::max);
         Work second = m.allreduce_async(Buffer(b), ReduceOp::min);
         second.wait();
         EXPECT_TRUE(first.is_completed());
         std::vector<float> both = values_of(a), rest = values_of(b);
         both.insert(both.end(), rest.begin(), rest.end());
         both.push_back(flag[0]);
         return both;
       }},
  };
}

// Every kind of call reissued through the host's front end, in place or not, blocking
// or not, as the host backend itself does it.
TEST(Staged, HostBuffersGiveWhatTheHostBackendGivesInEveryCall) {
  auto comm = staged_world();
  MpiCommunicator mpi(MPI_COMM_WORLD, test_options());
  for (tensor::DType dtype : {tensor::DType::f32, tensor::DType::bf16}) {
    for (const auto& [name, call] : calls()) {
      SCOPED_TRACE(name + " in " + std::string(tensor::dtype_name(dtype)));
      EXPECT_EQ(call(*comm, dtype, Device::cpu()), call(mpi, dtype, Device::cpu()));
    }
  }
}

TEST(Staged, CudaBuffersGiveWhatHostBuffersGiveInEveryCall) {
  if (tensor::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // By local rank, as the workers pick: ranks beyond the devices share them.
  const Device gpu = Device::cuda(world().rank() % tensor::cuda_device_count());
  tensor::cuda_set_device(gpu);
  auto comm = staged_world();
  for (tensor::DType dtype : {tensor::DType::f32, tensor::DType::bf16}) {
    for (const auto& [name, call] : calls()) {
      SCOPED_TRACE(name + " in " + std::string(tensor::dtype_name(dtype)));
      const std::vector<float> host = call(*comm, dtype, Device::cpu());
      EXPECT_EQ(call(*comm, dtype, gpu), host);
    }
  }
}

}  // namespace
}  // namespace troupe::collectives::testing::staged
