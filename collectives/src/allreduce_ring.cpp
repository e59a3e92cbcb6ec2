#include "allreduce_ring.hpp"

#include <algorithm>
#include <cstring>

#include "mpi_types.hpp"
#include "reduce_kernels.hpp"
#include "troupe/keep_until_exit.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives::detail {

namespace {
int wrap(int value, int n) { return ((value % n) + n) % n; }
}  // namespace

bool RingRoute::supports(const Collective& c, bool) const {
  const bool kind = c.kind == CollectiveKind::allreduce || c.kind == CollectiveKind::reduce ||
                    c.kind == CollectiveKind::reduce_scatter;
  const int size = site().mpi.size;
  if (!kind || size < 2) return false;
  const bool whole = c.kind != CollectiveKind::reduce_scatter;
  const std::size_t min_count = whole ? static_cast<std::size_t>(size) : 1;
  const std::size_t bytes = c.kind == CollectiveKind::reduce ? c.count * tensor::element_size(c.dtype)
                                                             : std::max(c.input.nbytes(), c.output.nbytes());
  return c.count >= min_count && bytes >= options().ring_threshold_bytes;
}

std::shared_ptr<Operation> RingRoute::run(const Collective& c) {
  const int tag = static_cast<int>(c.sequence % (static_cast<std::uint64_t>(site().tag_limit) + 1));
  return verify(std::make_shared<AllreduceRing>(c, site().mpi.comm, site().mpi.rank, site().mpi.size,
                                                options().segment_bytes, options().ring_window, tag),
                c);
}

AllreduceRing::AllreduceRing(Collective collective, MPI_Comm comm, int rank, int size, std::size_t segment_bytes,
                             int window, int tag)
    : Operation(std::move(collective)),
      comm_(comm),
      rank_(rank),
      size_(size),
      left_(wrap(rank - 1, size)),
      right_(wrap(rank + 1, size)),
      tag_(tag),
      gather_half_(this->collective().kind != CollectiveKind::reduce_scatter),
      shift_(this->collective().kind != CollectiveKind::reduce_scatter ? 0 : -1),
      element_bytes_(tensor::element_size(this->collective().dtype)),
      segment_elements_(std::max<std::size_t>(1, segment_bytes / element_bytes_)),
      window_(static_cast<std::size_t>(std::max(1, window))) {
  const std::size_t n = static_cast<std::size_t>(size_);
  // An allreduce's (and a reduce's) count is the whole buffer; a reduce_scatter's one block.
  const std::size_t count = this->collective().kind != CollectiveKind::reduce_scatter ? this->collective().count
                                                                                      : this->collective().count * n;
  // Balanced blocks: sizes differ by at most one element.
  block_offset_.resize(n + 1);
  std::size_t largest = 0;
  for (std::size_t b = 0; b <= n; ++b) block_offset_[b] = count * b / n;
  for (std::size_t b = 0; b < n; ++b) largest = std::max(largest, block_offset_[b + 1] - block_offset_[b]);
  segments_per_block_ = std::max<std::size_t>(1, (largest + segment_elements_ - 1) / segment_elements_);
  total_ = (gather_half_ ? 2 : 1) * (n - 1) * segments_per_block_;
}

AllreduceRing::~AllreduceRing() {
  // Abandoned after a failure with messages still posted: MPI may yet write into the
  // slots or read the scratch blocks, so they are leaked rather than freed under it.
  if (!recvs_.empty() || !sends_.empty()) {
    troupe::detail::keep_until_exit(slots_.release());
    troupe::detail::keep_until_exit(scratch_.release());
  }
}

bool AllreduceRing::reducing(std::size_t step) const { return step < static_cast<std::size_t>(size_ - 1); }

int AllreduceRing::send_block(std::size_t step) const {
  const int k = static_cast<int>(step);
  if (reducing(step)) return wrap(rank_ - k + shift_, size_);
  const int t = k - size_ + 1;
  return wrap(rank_ + 1 - t + shift_, size_);
}

int AllreduceRing::recv_block(std::size_t step) const {
  const int k = static_cast<int>(step);
  if (reducing(step)) return wrap(rank_ - k - 1 + shift_, size_);
  const int t = k - size_ + 1;
  return wrap(rank_ - t + shift_, size_);
}

std::byte* AllreduceRing::blocks() const { return scratch_ ? scratch_.get() : collective().output.bytes(); }

std::byte* AllreduceRing::segment(std::byte* base, int block, std::size_t j, std::size_t* elements) const {
  const std::size_t begin = block_offset_[block] + j * segment_elements_;
  const std::size_t end = std::min(block_offset_[block + 1], begin + segment_elements_);
  *elements = end > begin ? end - begin : 0;
  return base + std::min(begin, block_offset_[block + 1]) * element_bytes_;
}

void AllreduceRing::start() {
  const Collective& c = collective();
  if (c.kind == CollectiveKind::reduce_scatter) {
    scratch_ = std::make_unique<std::byte[]>(c.count * element_bytes_ * static_cast<std::size_t>(size_));
  } else if (c.kind == CollectiveKind::reduce && rank_ != c.root) {
    scratch_ = std::make_unique<std::byte[]>(c.count * element_bytes_);  // the root's result, not ours to keep
  }
  slots_ = std::make_unique<std::byte[]>(window_ * segment_elements_ * element_bytes_);
  for (int s = static_cast<int>(window_) - 1; s >= 0; --s) free_slots_.push_back(s);
  progress();
}

bool AllreduceRing::send_ready(std::size_t index) const {
  const std::size_t step = index / segments_per_block_, j = index % segments_per_block_;
  // Segment j of the block we send at step k was reduced (or received) at step k-1.
  return step == 0 || recvs_done_ > (step - 1) * segments_per_block_ + j;
}

bool AllreduceRing::recv_ready(std::size_t index) const {
  const std::size_t step = index / segments_per_block_, j = index % segments_per_block_;
  if (reducing(step)) return !free_slots_.empty();
  // Allgather receives overwrite the block this rank sent at reduce-scatter step t.
  const std::size_t n1 = static_cast<std::size_t>(size_ - 1);
  return sends_done_ > (step - n1) * segments_per_block_ + j;
}

void AllreduceRing::post_send(std::size_t index) {
  const Collective& c = collective();
  const std::size_t step = index / segments_per_block_, j = index % segments_per_block_;
  // The first reduce-scatter step sends the input itself; everything later comes from
  // the blocks.
  std::byte* base = step == 0 ? c.input.bytes() : blocks();
  std::size_t n = 0;
  std::byte* data = segment(base, send_block(step), j, &n);
  Pending p{MPI_REQUEST_NULL, -1};
  TROUPE_MPI_CHECK(MPI_Isend(data, static_cast<int>(n), mpi_datatype(c.dtype), right_, tag_, comm_, &p.request));
  sends_.push_back(p);
}

void AllreduceRing::post_recv(std::size_t index) {
  const Collective& c = collective();
  const std::size_t step = index / segments_per_block_, j = index % segments_per_block_;
  std::size_t n = 0;
  Pending p{MPI_REQUEST_NULL, -1};
  std::byte* data = segment(blocks(), recv_block(step), j, &n);
  if (reducing(step)) {
    p.slot = free_slots_.back();
    free_slots_.pop_back();
    data = slots_.get() + static_cast<std::size_t>(p.slot) * segment_elements_ * element_bytes_;
  }
  TROUPE_MPI_CHECK(MPI_Irecv(data, static_cast<int>(n), mpi_datatype(c.dtype), left_, tag_, comm_, &p.request));
  recvs_.push_back(p);
}

void AllreduceRing::complete_recv(std::size_t index, int slot) {
  if (slot < 0) return;  // an allgather step: the data already sits in the output
  const Collective& c = collective();
  const std::size_t step = index / segments_per_block_, j = index % segments_per_block_;
  std::size_t n = 0;
  const int block = recv_block(step);
  std::byte* out = segment(blocks(), block, j, &n);
  const std::byte* own = segment(c.input.bytes(), block, j, &n);
  const std::byte* partial = slots_.get() + static_cast<std::size_t>(slot) * segment_elements_ * element_bytes_;
  const bool last = step + 2 == static_cast<std::size_t>(size_);
  const double scale = c.op == ReduceOp::avg && last ? 1.0 / size_ : 1.0;
  reduce(c.op, c.dtype, out, own, partial, n, scale);
  free_slots_.push_back(slot);
}

bool AllreduceRing::progress() {
  for (bool moved = true; moved;) {
    moved = false;
    while (!recvs_.empty()) {
      int flag = 0;
      TROUPE_MPI_CHECK(MPI_Test(&recvs_.front().request, &flag, MPI_STATUS_IGNORE));
      if (!flag) break;
      const int slot = recvs_.front().slot;
      recvs_.pop_front();
      complete_recv(recvs_done_++, slot);
      moved = true;
    }
    while (!sends_.empty()) {
      int flag = 0;
      TROUPE_MPI_CHECK(MPI_Test(&sends_.front().request, &flag, MPI_STATUS_IGNORE));
      if (!flag) break;
      sends_.pop_front();
      ++sends_done_;
      moved = true;
    }
    while (next_recv_ < total_ && recvs_.size() < window_ && recv_ready(next_recv_)) {
      post_recv(next_recv_++);
      moved = true;
    }
    while (next_send_ < total_ && sends_.size() < window_ && send_ready(next_send_)) {
      post_send(next_send_++);
      moved = true;
    }
  }
  if (sends_done_ != total_ || recvs_done_ != total_) return false;
  if (scratch_ && collective().kind == CollectiveKind::reduce_scatter) {
    // Block r is complete; it is the output (which may be block r of the input itself,
    // read by nobody any more).
    const std::size_t block_bytes = collective().count * element_bytes_;
    std::memcpy(collective().output.bytes(), scratch_.get() + static_cast<std::size_t>(rank_) * block_bytes,
                block_bytes);
  }
  scratch_.reset();
  return true;
}

std::string AllreduceRing::waiting_on() const {
  if (!recvs_.empty())
    return troupe::detail::concat("rank ", left_, " (ring message ", recvs_done_, " of ", total_, ")");
  if (!sends_.empty())
    return troupe::detail::concat("rank ", right_, " (ring message ", sends_done_, " of ", total_, ")");
  return {};
}

}  // namespace troupe::collectives::detail
