// DistributedSampler and DataLoader: local objects, but run in the MPI binary like
// the rest (every rank runs them; they need no communication).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "troupe/error.hpp"
#include "troupe/train/data_loader.hpp"
#include "troupe/train/distributed_sampler.hpp"

namespace troupe::train {
namespace {

std::vector<std::vector<std::int64_t>> parts(std::int64_t n, int replicas, SamplerOptions options,
                                             std::int64_t epoch = 0) {
  std::vector<std::vector<std::int64_t>> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(n, replicas, r, options);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

TEST(DistributedSampler, PartsAreDisjointEqualAndCoverEverySampleWhenTheyDivideEvenly) {
  for (int replicas : {1, 2, 3, 4}) {
    const auto p = parts(12, replicas, {.seed = 5});
    std::multiset<std::int64_t> seen;
    for (const auto& part : p) {
      EXPECT_EQ(part.size(), 12u / static_cast<unsigned>(replicas));
      seen.insert(part.begin(), part.end());
    }
    std::multiset<std::int64_t> want;
    for (std::int64_t i = 0; i < 12; ++i) want.insert(i);
    EXPECT_EQ(seen, want) << replicas << " replicas";
  }
}

TEST(DistributedSampler, PadsWithTheFirstIndicesToEqualLengthsOrDropsTheTail) {
  // 10 samples on 4 replicas: padded to 12 (3 each, two repeats) or cut to 8 (2 each).
  const auto padded = parts(10, 4, {.seed = 9});
  std::set<std::int64_t> distinct;
  std::size_t total = 0;
  for (const auto& part : padded) {
    EXPECT_EQ(part.size(), 3u);
    distinct.insert(part.begin(), part.end());
    total += part.size();
  }
  EXPECT_EQ(total, 12u);
  EXPECT_EQ(distinct.size(), 10u) << "every sample appears; two of them twice";
  const auto order = epoch_permutation(10, 9, 0);
  // The padding is the permutation's first two indices, at positions 10 and 11:
  // rank 2 and rank 3's last element.
  EXPECT_EQ(padded[2].back(), order[0]);
  EXPECT_EQ(padded[3].back(), order[1]);

  const auto dropped = parts(10, 4, {.seed = 9, .drop_last = true});
  std::set<std::int64_t> kept;
  for (const auto& part : dropped) {
    EXPECT_EQ(part.size(), 2u);
    kept.insert(part.begin(), part.end());
  }
  EXPECT_EQ(kept.size(), 8u) << "disjoint, and the last 2 of the permutation are dropped";
  EXPECT_FALSE(kept.count(order[8]));
  EXPECT_FALSE(kept.count(order[9]));
}

TEST(DistributedSampler, ShufflesPerEpochTheSameWayOnEveryRankAndRun) {
  const auto a = epoch_permutation(100, 1, 0), b = epoch_permutation(100, 1, 1), c = epoch_permutation(100, 2, 0);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a, epoch_permutation(100, 1, 0));
  DistributedSampler s(100, 1, 0, {.seed = 1});
  s.set_epoch(1);
  EXPECT_EQ(s.indices(), b);
  DistributedSampler ordered(5, 1, 0, {.shuffle = false});
  EXPECT_EQ(ordered.indices(), (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
}

TEST(DistributedSampler, StridedPartsOfBatchBMakeTheSingleRankBatchOfRTimesB) {
  DistributedSampler one(64, 1, 0, {.seed = 3});
  const auto& whole = one.indices();
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(64, 4, r, {.seed = 3});
    for (std::int64_t k = 0; k < 4; ++k) {  // batch k of 4 on rank r
      const auto batch = s.take(4);
      for (auto i : batch) {
        const auto pos = std::find(whole.begin(), whole.end(), i) - whole.begin();
        EXPECT_GE(pos, 16 * k);
        EXPECT_LT(pos, 16 * (k + 1));
      }
    }
  }
}

TEST(DistributedSampler, ResumesMidEpochFromItsStateDict) {
  DistributedSampler a(50, 2, 1, {.seed = 4});
  a.set_epoch(3);
  a.take(7);
  const nn::StateDict state = a.state_dict();
  DistributedSampler b(50, 2, 1, {.seed = 999});
  b.load_state_dict(state);
  EXPECT_EQ(b.epoch(), 3);
  EXPECT_EQ(b.position(), 7);
  EXPECT_EQ(b.remaining(), a.remaining());
  EXPECT_EQ(b.take(100), a.take(100));
  EXPECT_TRUE(b.exhausted());
}

TEST(DistributedSampler, AStateAtAnEpochBoundaryLoadsAtAnotherWorldSize) {
  DistributedSampler a(50, 2, 1, {.seed = 4});
  a.set_epoch(3);
  a.take(100);  // the whole epoch: 25 samples
  DistributedSampler b(50, 4, 2, {.seed = 999});
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.epoch(), 3);
  EXPECT_TRUE(b.exhausted());
  EXPECT_EQ(b.remaining().size(), 0u);
  DistributedSampler fresh(50, 2, 0, {.seed = 4});
  fresh.set_epoch(5);
  b.load_state_dict(fresh.state_dict());
  EXPECT_EQ(b.epoch(), 5);
  EXPECT_EQ(b.position(), 0);
  DistributedSampler same(50, 4, 2, {.seed = 4});
  same.set_epoch(5);
  EXPECT_EQ(b.remaining(), same.remaining());
}

// R ranks that consumed p batches of B, resumed on R' ranks: the R' parts of the rest
// of the epoch hold every sample the first run had not reached, each once (apart from
// padding), and with the same global batch G = R B = R' B' the k-th global batch is
// the same set of samples as in the run that never stopped.
TEST(DistributedSampler, MidEpochAtAnotherWorldSizeSplitsTheRestOfTheEpochAnew) {
  constexpr std::int64_t n = 96, global_batch = 12;
  for (auto [from, to] : {std::pair{2, 4}, {4, 2}, {2, 1}, {3, 2}, {4, 3}}) {
    SCOPED_TRACE(std::to_string(from) + " -> " + std::to_string(to) + " ranks");
    const SamplerOptions options{.seed = 4};
    std::vector<DistributedSampler> before, whole;
    for (int r = 0; r < from; ++r) before.emplace_back(n, from, r, options), whole.emplace_back(n, from, r, options);
    for (auto* group : {&before, &whole})
      for (auto& s : *group) s.set_epoch(2);
    // Three global batches done, then the state of any rank (they agree) is saved.
    std::multiset<std::int64_t> seen;
    for (int k = 0; k < 3; ++k)
      for (auto& s : before)
        for (auto i : s.take(global_batch / from)) seen.insert(i);
    const nn::StateDict state = before[0].state_dict();

    std::vector<DistributedSampler> after;
    for (int r = 0; r < to; ++r) {
      after.emplace_back(n, to, r, SamplerOptions{.seed = 1});
      after.back().load_state_dict(state);
      EXPECT_EQ(after.back().epoch(), 2);
      EXPECT_EQ(after.back().start(), 3 * global_batch);
    }
    // Batch by batch, the resumed ranks together take what the uninterrupted run's
    // ranks take together.
    for (int k = 0; k < 3; ++k)
      for (auto& s : whole) s.take(global_batch / from);
    while (!whole[0].exhausted()) {
      std::multiset<std::int64_t> want, got;
      for (auto& s : whole)
        for (auto i : s.take(global_batch / from)) want.insert(i);
      for (auto& s : after)
        for (auto i : s.take(global_batch / to)) got.insert(i), seen.insert(i);
      EXPECT_EQ(got, want);
    }
    for (auto& s : after) EXPECT_TRUE(s.exhausted());
    // Every sample once over the two runs (96 divides by every world size here).
    std::multiset<std::int64_t> all;
    for (std::int64_t i = 0; i < n; ++i) all.insert(i);
    EXPECT_EQ(seen, all);
    // A state saved after the re-split resumes the re-split epoch at the same world size.
    after[0].take(0);
    DistributedSampler again(n, to, 0, options);
    again.load_state_dict(after[0].state_dict());
    EXPECT_EQ(again.start(), after[0].start());
    EXPECT_EQ(again.position(), after[0].position());
  }
}

TEST(DistributedSampler, UnevenSharesCutEachGlobalBatchOfTheSingleRankOrder) {
  // 64 over 3 ranks: 22, 21, 21 of every block of 64 positions; together each block is
  // the single-rank batch of 64, and the weights R * count / 64 average to 1.
  const std::int64_t n = 200, m = 64;
  DistributedSampler one(n, 1, 0, {.seed = 9});
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(n, 3, r, SamplerOptions{.seed = 9, .global_batch = m});
  EXPECT_EQ(ranks[0].local_batch(), 22);
  EXPECT_EQ(ranks[1].local_batch(), 21);
  EXPECT_EQ(ranks[2].local_batch(), 21);
  std::multiset<std::int64_t> all;
  for (int block = 0; block < 4; ++block) {  // 201 positions after padding: 3 blocks of 64, one of 9
    const auto want = one.take(m);
    std::multiset<std::int64_t> got;
    double weights = 0;
    for (auto& s : ranks) {
      const std::int64_t position = s.position();
      const auto part = s.take(s.local_batch());
      weights += s.batch_weight(position, static_cast<std::int64_t>(part.size()));
      got.insert(part.begin(), part.end());
    }
    all.insert(got.begin(), got.end());
    if (block < 3) {
      EXPECT_EQ(got, std::multiset<std::int64_t>(want.begin(), want.end())) << "block " << block;
    } else {
      EXPECT_EQ(got.size(), 9u);  // the epoch's last block: 8 real positions and 1 of padding
    }
    EXPECT_NEAR(weights, 3.0, 1e-12) << "block " << block;
  }
  for (auto& s : ranks) EXPECT_TRUE(s.exhausted());
  for (std::int64_t i = 0; i < n; ++i) EXPECT_GE(all.count(i), 1u) << i;
  // With shares that divide evenly the blocks are the plain strided split.
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(DistributedSampler(n, 4, r, {.seed = 9, .global_batch = 64}).indices(),
              DistributedSampler(n, 4, r, {.seed = 9}).indices());
}

TEST(DistributedSampler, UnevenSharesResumeOnTheSameAndOnAnotherWorldSize) {
  // 3 ranks, 64 a step, stopped after 2 steps: every rank's state says 128 positions
  // are done. The same split goes on at each rank's own position; 2 ranks (32 each)
  // go on from position 128 of the epoch, covering the rest once.
  const std::int64_t n = 300, m = 64;
  std::vector<nn::StateDict> states;
  std::multiset<std::int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(n, 3, r, {.seed = 4, .global_batch = m});
    s.set_epoch(1);
    for (int step = 0; step < 2; ++step) {
      const auto part = s.take(s.local_batch());
      seen.insert(part.begin(), part.end());
    }
    states.push_back(s.state_dict());
    EXPECT_EQ(states.back().at("consumed").to_vector<std::int64_t>().at(0), 128);
  }
  for (int r = 0; r < 3; ++r) {
    DistributedSampler same(n, 3, r, {.seed = 4, .global_batch = m});
    same.load_state_dict(states[0]);  // rank 0's state: every rank finds its own place
    EXPECT_EQ(same.position(), 2 * same.local_batch());
  }
  std::multiset<std::int64_t> rest;
  for (int r = 0; r < 2; ++r) {
    DistributedSampler two(n, 2, r, {.seed = 4, .global_batch = m});
    two.load_state_dict(states[static_cast<std::size_t>(r)]);
    EXPECT_EQ(two.start(), 128);
    const auto part = two.remaining();
    rest.insert(part.begin(), part.end());
  }
  std::multiset<std::int64_t> all = seen;
  all.insert(rest.begin(), rest.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(n));  // 128 + 172, no padding needed
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(all.count(i), 1u) << i;
}

TEST(DistributedSampler, RefusesAStateForAnotherDataSet) {
  DistributedSampler a(50, 2, 0);
  a.take(7);
  DistributedSampler other_data(51, 2, 0);
  try {
    other_data.load_state_dict(a.state_dict());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the state is for 50 samples"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DistributedSampler(10, 2, 2), InvalidArgument);
}

TEST(DataLoader, YieldsTheSamplersIndicesInBatchesAndMovesItsPositionOnlyWhenHandedOut) {
  DistributedSampler sampler(23, 1, 0, {.seed = 2});
  DataLoader<std::vector<std::int64_t>> loader(
      sampler, 5, [](const std::vector<std::int64_t>& idx) { return idx; }, 3);
  EXPECT_EQ(loader.batches_per_epoch(), 5);
  std::vector<std::int64_t> seen;
  int batches = 0;
  while (auto batch = loader.next()) {
    ++batches;
    seen.insert(seen.end(), batch->begin(), batch->end());
    EXPECT_EQ(sampler.position(), static_cast<std::int64_t>(seen.size()))
        << "prefetched batches must not count as consumed";
  }
  EXPECT_EQ(batches, 5);
  EXPECT_EQ(seen, sampler.indices());
  EXPECT_FALSE(loader.next().has_value()) << "the epoch stays ended until set_epoch";
  sampler.set_epoch(1);
  auto first = loader.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, std::vector<std::int64_t>(sampler.indices().begin(), sampler.indices().begin() + 5));
}

TEST(DataLoader, ResumesFromARestoredSamplerPosition) {
  DistributedSampler a(40, 2, 0, {.seed = 8});
  DataLoader<std::vector<std::int64_t>> la(a, 4, [](const auto& idx) { return idx; });
  la.next();
  la.next();
  const auto state = a.state_dict();
  std::vector<std::int64_t> rest_a;
  while (auto b = la.next()) rest_a.insert(rest_a.end(), b->begin(), b->end());

  DistributedSampler b(40, 2, 0, {.seed = 8});
  b.load_state_dict(state);
  DataLoader<std::vector<std::int64_t>> lb(b, 4, [](const auto& idx) { return idx; });
  std::vector<std::int64_t> rest_b;
  while (auto batch = lb.next()) rest_b.insert(rest_b.end(), batch->begin(), batch->end());
  EXPECT_EQ(rest_b, rest_a);
  EXPECT_EQ(rest_b.size(), 12u);
}

TEST(DataLoader, DropLastLeavesOutTheShortBatchAndCollateErrorsReachNext) {
  DistributedSampler sampler(10, 1, 0);
  DataLoader<std::size_t> loader(
      sampler, 4, [](const auto& idx) { return idx.size(); }, 2, /*drop_last=*/true);
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  int n = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(*b, 4u);
    ++n;
  }
  EXPECT_EQ(n, 2);

  DistributedSampler s2(10, 1, 0);
  DataLoader<int> failing(s2, 4, [](const auto& idx) -> int {
    if (idx.size() < 4) throw std::runtime_error("bad sample in the last batch");
    return 1;
  });
  EXPECT_EQ(*failing.next(), 1);
  EXPECT_EQ(*failing.next(), 1);
  EXPECT_THROW(failing.next(), std::runtime_error);
}

TEST(DataLoader, CollatesOnItsOwnThreadAheadOfTheConsumer) {
  DistributedSampler sampler(40, 1, 0);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::atomic<int> collated{0};
  DataLoader<int> loader(
      sampler, 4,
      [&](const auto&) {
        std::lock_guard lock(mutex);
        threads.insert(std::this_thread::get_id());
        return ++collated;
      },
      /*prefetch=*/3);
  ASSERT_EQ(*loader.next(), 1);
  // While the consumer holds batch 1, the loader fills its queue of 3 on its own.
  for (int i = 0; i < 2000 && collated.load() < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(collated.load(), 4) << "one handed out plus three prefetched";
  EXPECT_EQ(sampler.position(), 4) << "prefetching consumes nothing";
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u) << "collation must not run on the consumer's thread";
}

}  // namespace
}  // namespace troupe::train
