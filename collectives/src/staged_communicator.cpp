#include "troupe/collectives/staged_communicator.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "reissue.hpp"
#include "troupe/collectives/operation.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/storage.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::collectives {

namespace {

using K = CollectiveKind;
using tensor::Tensor;

// `bytes` bytes at `data` on `device` as a u8 tensor that does not own them.
Tensor bytes_view(std::byte* data, std::size_t bytes, Device device) {
  return Tensor::from_storage(tensor::Storage::adopt(data, bytes, device, nullptr), {static_cast<std::int64_t>(bytes)},
                              DType::u8);
}

bool on_device(const Buffer& b) { return b.count > 0 && b.device.is_cuda(); }

// Whether the host backend writes this rank's output: not a reduce's or gather's
// away from the root (their output may be any buffer, even a live one), never a
// send's or a barrier's.
bool output_written(const Collective& c, int rank) {
  if (c.kind == K::send || c.kind == K::barrier) return false;
  if (c.kind == K::reduce || c.kind == K::gather) return rank == c.root;
  return true;
}

// One call's host copies: the host call to run and, once it has, the copy back.
class Staging {
 public:
  Staging(const Collective& c, int rank) : host_call_(c) {
    const bool stage_in = on_device(c.input), stage_out = on_device(c.output) && output_written(c, rank);
    if (c.in_place) {
      // One is the other or a slice of it: stage the span of both, so the host call
      // sees the same aliasing (an allgather's own slice, reduce_scatter's block).
      // (An empty side, say a reduce's output away from the root, takes no part.)
      const Buffer& outer = c.output.count >= c.input.count ? c.output : c.input;
      host_ = Tensor::empty({static_cast<std::int64_t>(outer.nbytes())}, DType::u8);
      host_.copy_(bytes_view(outer.bytes(), outer.nbytes(), outer.device));
      auto* base = static_cast<std::byte*>(host_.raw_data());
      const auto place = [&](const Buffer& b) {
        return b.count == 0 ? Buffer(nullptr, 0, b.dtype) : host_buffer(b, base + (b.bytes() - outer.bytes()));
      };
      host_call_.input = place(c.input);
      host_call_.output = place(c.output);
    } else {
      if (stage_in) {
        host_ = Tensor::empty({static_cast<std::int64_t>(c.input.nbytes())}, DType::u8);
        host_.copy_(bytes_view(c.input.bytes(), c.input.nbytes(), c.input.device));
        host_call_.input = host_buffer(c.input, static_cast<std::byte*>(host_.raw_data()));
      }
      if (on_device(c.output)) {
        // Unwritten outputs get a host buffer too, so no device pointer reaches MPI.
        host_out_ = Tensor::empty({static_cast<std::int64_t>(c.output.nbytes())}, DType::u8);
        host_call_.output = host_buffer(c.output, static_cast<std::byte*>(host_out_.raw_data()));
      }
    }
    if (stage_out) back_ = {host_call_.output, c.output};
  }

  const Collective& host_call() const { return host_call_; }

  // The host result to the device buffer (stream-ordered before later kernels).
  void copy_back() const {
    if (!back_.second.data) return;
    tensor::cuda_set_device(back_.second.device);  // whichever thread drives progress
    bytes_view(back_.second.bytes(), back_.second.nbytes(), back_.second.device)
        .copy_(bytes_view(back_.first.bytes(), back_.first.nbytes(), Device::cpu()));
  }

 private:
  static Buffer host_buffer(const Buffer& b, std::byte* data) { return Buffer(data, b.count, b.dtype); }

  Collective host_call_;
  Tensor host_, host_out_;          // host copies, alive until the copy back
  std::pair<Buffer, Buffer> back_;  // (host, device): where the result goes
};

// Waits for the host call, then copies its result back; on the staged communicator's
// engine, in order with its other calls.
class StagedOperation final : public Operation {
 public:
  StagedOperation(const Collective& c, std::shared_ptr<Staging> staging, Work host)
      : Operation(c), staging_(std::move(staging)), host_(std::move(host)) {}
  void start() override {}
  bool progress() override {
    if (!host_.test()) return false;
    if (auto error = host_.exception()) std::rethrow_exception(error);
    staging_->copy_back();
    return true;
  }

 private:
  std::shared_ptr<Staging> staging_;
  Work host_;
};

}  // namespace

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> host)
    : Communicator(host ? host->rank() : 0, host ? host->size() : 1, host ? host->options() : Options{}),
      host_(std::move(host)) {
  TROUPE_CHECK(host_ != nullptr, "StagedCommunicator: no host communicator given");
}

// The host calls our operations wait on live in host_, destroyed after this body.
StagedCommunicator::~StagedCommunicator() { drain(); }

std::unique_ptr<Communicator> StagedCommunicator::split(int color, int key) {
  // The host's split is collective over the host's ranks, as ours must be.
  std::unique_ptr<Communicator> part = host_->split(color, key);
  if (!part) return nullptr;
  return std::make_unique<StagedCommunicator>(std::move(part));
}

Work StagedCommunicator::start(const Collective& c, bool blocking) {
  for (const Buffer* b : {&c.input, &c.output}) {
    TROUPE_CHECK(b->count == 0 || b->device.is_cpu() || b->device.is_cuda(), c.describe(),
                 ": a staged communicator copies CUDA or host memory, but a buffer is on ", b->device, " [rank ",
                 rank(), "]");
  }
  try {
    if (!on_device(c.input) && !on_device(c.output)) return detail::reissue(*host_, c, blocking);
    auto staging = std::make_shared<Staging>(c, rank());
    Work host = detail::reissue(*host_, staging->host_call(), blocking);
    if (blocking) {
      staging->copy_back();
      return Work();
    }
    return launch(std::make_shared<StagedOperation>(c, std::move(staging), std::move(host)), false);
  } catch (const InvalidArgument&) {
    throw;  // refused before anything was sent
  } catch (const std::exception& e) {
    fail(e.what());  // the host communicator has failed: so have we
    throw;
  }
}

}  // namespace troupe::collectives
