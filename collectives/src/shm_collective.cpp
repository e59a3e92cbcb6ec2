#include "shm_collective.hpp"

#include <algorithm>
#include <cstring>

#include "reduce_kernels.hpp"
#include "troupe/error.hpp"

namespace troupe::collectives::detail {

namespace {
using K = CollectiveKind;
constexpr const char* kStageName[] = {"posting", "reducing", "gathering"};
}  // namespace

bool ShmRoute::supports(const Collective& c, bool) const {
  return site().shm && (c.kind == K::allreduce || c.kind == K::reduce || c.kind == K::reduce_scatter ||
                        c.kind == K::allgather || c.kind == K::broadcast);
}

std::shared_ptr<Operation> ShmRoute::run(const Collective& c) {
  return verify(std::make_shared<ShmCollective>(c, *site().shm), c);
}

namespace {
// reduce runs as allreduce does -- every rank reduces its 1/n share of each chunk, in
// rank order -- and only the root gathers the shares: the same bits as an allreduce,
// with (n-1)/n of the copying out saved.
bool reduces_shares(CollectiveKind kind) { return kind == K::allreduce || kind == K::reduce; }
}  // namespace

ShmCollective::ShmCollective(Collective collective, ShmChannel& channel)
    : Operation(std::move(collective)),
      channel_(channel),
      rank_(channel.rank()),
      size_(channel.size()),
      element_bytes_(tensor::element_size(this->collective().dtype)) {
  const std::size_t per_slot = channel_.slot_bytes() / element_bytes_;
  // reduce_scatter puts one chunk of each of the n blocks side by side in a slot.
  chunk_ = std::max<std::size_t>(1, this->collective().kind == K::reduce_scatter ? per_slot / size_ : per_slot);
  rounds_ = (this->collective().count + chunk_ - 1) / chunk_;
}

void ShmCollective::start() {
  first_ = channel_.reserve(rounds_);
  progress();
}

ShmCollective::Piece ShmCollective::piece(std::uint64_t round) const {
  const std::size_t begin = static_cast<std::size_t>(round - first_) * chunk_;
  return {begin, std::min(chunk_, collective().count - begin)};
}

std::size_t ShmCollective::sub_begin(std::size_t length, int q) const {
  return length * static_cast<std::size_t>(q) / static_cast<std::size_t>(size_);
}

bool ShmCollective::advance(ShmChannel::Stage stage) {
  std::uint64_t& next = channel_.next[stage];
  const std::uint64_t round = next;
  // Earlier collectives' rounds come first; ours are [first_, first_ + rounds_).
  if (round < first_ || round >= first_ + rounds_) return false;
  const Collective& c = collective();
  int laggard = -1;
  switch (stage) {
    case ShmChannel::posted: {
      // The slot is free once every rank consumed the round that last used it.
      const std::uint64_t slots = static_cast<std::uint64_t>(channel_.slots());
      if (round >= slots && !channel_.all_reached(ShmChannel::consumed, round - slots + 1, &laggard)) break;
      post(round);
      break;
    }
    case ShmChannel::reduced: {
      if (round >= channel_.next[ShmChannel::posted]) return false;
      const bool reads_peers = reduces_shares(c.kind) || c.kind == K::reduce_scatter;
      if (reads_peers && !channel_.all_reached(ShmChannel::posted, round + 1, &laggard)) break;
      reduce(round);
      break;
    }
    case ShmChannel::consumed: {
      if (round >= channel_.next[ShmChannel::reduced]) return false;
      const bool reads_peers = c.kind != K::reduce_scatter && (c.kind != K::reduce || rank_ == c.root);
      if (reads_peers && !channel_.all_reached(ShmChannel::reduced, round + 1, &laggard)) break;
      gather(round);
      break;
    }
  }
  if (laggard >= 0) {
    laggard_ = laggard;
    waiting_stage_ = stage;
    return false;
  }
  next = round + 1;
  channel_.publish(stage, next);
  return true;
}

void ShmCollective::post(std::uint64_t round) {
  const Collective& c = collective();
  const auto [begin, length] = piece(round);
  std::byte* slot = channel_.slot(rank_, round);
  const std::byte* in = c.input.bytes();
  const std::size_t eb = element_bytes_;
  switch (c.kind) {
    case K::reduce_scatter:
      for (int b = 0; b < size_; ++b) {
        channel_.writer.copy(slot + static_cast<std::size_t>(b) * chunk_ * eb, in + (b * c.count + begin) * eb,
                             length * eb);
      }
      return;
    case K::broadcast:
      if (rank_ != c.root) return;
      channel_.writer.copy(slot, in + begin * eb, length * eb);
      return;
    default: channel_.writer.copy(slot, in + begin * eb, length * eb);
  }
}

void ShmCollective::reduce(std::uint64_t round) {
  const Collective& c = collective();
  if (!reduces_shares(c.kind) && c.kind != K::reduce_scatter) return;
  const auto [begin, length] = piece(round);
  const std::size_t eb = element_bytes_;
  std::size_t offset, count;  // bytes into every slot, elements
  std::byte* dst;
  if (reduces_shares(c.kind)) {
    const std::size_t first = sub_begin(length, rank_);
    offset = first * eb;
    count = sub_begin(length, rank_ + 1) - first;
    dst = channel_.slot(rank_, round) + offset;
  } else {
    offset = static_cast<std::size_t>(rank_) * chunk_ * eb;
    count = length;
    dst = c.output.bytes() + begin * eb;
  }
  if (count == 0) return;
  // An allreduce's result goes into my own slot, which is also my input: from rank 2 on,
  // the partial sums wait in scratch until the last combine, or the first would
  // overwrite my contribution before it is added.
  std::byte* partial = dst;
  if (reduces_shares(c.kind) && rank_ >= 2 && size_ > 2) {
    scratch_.resize(channel_.slot_bytes());
    partial = scratch_.data();
  }
  reduce_in_rank_order(c.op, c.dtype, dst, partial, count, size_,
                       [&](int q) { return channel_.slot(q, round) + offset; });
}

void ShmCollective::gather(std::uint64_t round) {
  const Collective& c = collective();
  const auto [begin, length] = piece(round);
  const std::size_t eb = element_bytes_;
  std::byte* out = c.output.bytes();
  switch (c.kind) {
    case K::reduce:
      if (rank_ != c.root) return;
      [[fallthrough]];
    case K::allreduce:
      for (int q = 0; q < size_; ++q) {
        const std::size_t first = sub_begin(length, q), n = sub_begin(length, q + 1) - first;
        std::memcpy(out + (begin + first) * eb, channel_.slot(q, round) + first * eb, n * eb);
      }
      return;
    case K::allgather:
      for (int q = 0; q < size_; ++q) {
        std::memcpy(out + (q * c.count + begin) * eb, channel_.slot(q, round), length * eb);
      }
      return;
    case K::broadcast: {
      const std::byte* from = rank_ == c.root ? c.input.bytes() + begin * eb : channel_.slot(c.root, round);
      if (from != out + begin * eb) std::memcpy(out + begin * eb, from, length * eb);
      return;
    }
    default: return;  // reduce_scatter wrote its output while reducing
  }
}

bool ShmCollective::progress() {
  for (bool moved = true; moved;) {
    moved = advance(ShmChannel::posted);
    moved = advance(ShmChannel::reduced) || moved;
    moved = advance(ShmChannel::consumed) || moved;
  }
  return channel_.next[ShmChannel::consumed] >= first_ + rounds_;
}

std::string ShmCollective::waiting_on() const {
  if (laggard_ < 0) return {};
  const std::uint64_t done =
      channel_.next[ShmChannel::consumed] > first_ ? channel_.next[ShmChannel::consumed] - first_ : 0;
  return troupe::detail::concat("rank ", laggard_, " (shared-memory round ", done, " of ", rounds_, ", ",
                                kStageName[waiting_stage_], ")");
}

}  // namespace troupe::collectives::detail
