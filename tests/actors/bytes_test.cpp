#include <chrono>
#include <numeric>
#include <thread>

#include "../../actors/src/wire.hpp"
#include "actors_fixture.hpp"
#include "troupe/actors/bytes.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
struct Store {
  Bytes echo(Bytes b) { return b; }
  std::uint64_t checksum(std::vector<Bytes> parts) {
    std::uint64_t sum = 0;
    for (const Bytes& p : parts)
      for (std::byte b : p.span()) sum = sum * 31 + static_cast<std::uint8_t>(b);
    return sum;
  }
  void keep(Bytes b) { kept = b; }
  std::size_t kept_size() const { return kept.size(); }
  Bytes kept;
  static constexpr auto troupe_methods =
      troupe::methods<&Store::echo, &Store::checksum, &Store::keep, &Store::kept_size>;
};

Bytes pattern(std::size_t size, int seed) {
  std::vector<std::byte> data(size);
  for (std::size_t i = 0; i < size; ++i)
    data[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(seed)) & 0xff);
  return Bytes(std::move(data));
}
}  // namespace

TEST(Bytes, TravelAsAttachmentsOf0And1ByteAnd64MegabytesBothWays) {
  if (runtime().rank() == 0) {
    auto store = runtime().spawn<Store>(last_rank());
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{64} << 20}) {
      const Bytes sent = pattern(size, 3);
      const Bytes back = store.ask(&Store::echo, sent).get();
      EXPECT_EQ(back.size(), size);
      EXPECT_TRUE(back == sent) << size << " bytes";
    }
  }
  barrier();
}

TEST(Bytes, SeveralAttachmentsInOneMessageKeepTheirOrder) {
  if (runtime().rank() == 0) {
    auto store = runtime().spawn<Store>(last_rank());
    std::vector<Bytes> parts = {pattern(100000, 1), pattern(0, 2), pattern(7, 3), pattern(300000, 4)};
    std::uint64_t expected = 0;
    for (const Bytes& p : parts)
      for (std::byte b : p.span()) expected = expected * 31 + static_cast<std::uint8_t>(b);
    EXPECT_EQ(store.ask(&Store::checksum, parts).get(), expected);
    store.tell(&Store::keep, pattern(12345, 5));
    EXPECT_EQ(store.ask(&Store::kept_size).get(), 12345u);
  }
  barrier();
}

TEST(Bytes, ConcurrentSendersWithAttachmentsDoNotMixThemUp) {
  auto stores = runtime().spawn_on_each<Store>();
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const Bytes sent = pattern(50000 + static_cast<std::size_t>(t * 1000 + i), t * 100 + i);
        const auto& target = stores[static_cast<std::size_t>((runtime().rank() + 1) % runtime().size())];
        if (!(target.ask(&Store::echo, sent).get() == sent)) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  barrier();
}

TEST(Bytes, AMessageWhoseAttachmentTableIsCutShortIsDroppedAndTheRankGoesOn) {
  if (runtime().rank() == 0) {
    auto store = runtime().spawn<Store>(last_rank());
    std::string forged = Runtime::new_message();
    actors::detail::Header h;
    h.kind = actors::detail::Kind::tell;
    h.attachments = 3;  // announced, with no size table behind the header
    h.attachment_tag = actors::detail::kFirstAttachmentTag;
    actors::detail::write_header(forged, h);
    runtime().send_raw(last_rank(), forged);
    EXPECT_EQ(store.ask(&Store::echo, pattern(10, 1)).get().size(), 10u);
  }
  barrier();
}

TEST(Bytes, AMessageCarryingAttachmentsItDoesNotHoldIsDroppedAndTheRankGoesOn) {
  if (runtime().rank() == 0) {
    auto store = runtime().spawn<Store>(last_rank());
    // Header, then a size table of one attachment plus where the payload ends, then
    // zeros up to `total` bytes: small ones arrive as strings, large ones in pooled
    // buffers (both paths check the table).
    auto forge = [](std::uint64_t size, std::uint64_t payload_end, std::size_t total) {
      std::string forged = Runtime::new_message();
      actors::detail::Header h;
      h.kind = actors::detail::Kind::tell;
      h.attachments = 1;
      h.attachment_tag = actors::detail::kAttachedTag;
      actors::detail::write_header(forged, h);
      forged.append(reinterpret_cast<const char*>(&size), sizeof size);
      forged.append(reinterpret_cast<const char*>(&payload_end), sizeof payload_end);
      forged.resize(total, '\0');
      return forged;
    };
    const std::string cases[] = {
        forge(10, 48, 40),         // the table is cut short
        forge(10, 1 << 20, 8192),  // the payload ends past the message
        forge(10, 8, 8192),        // ... or inside the header
        forge(1 << 20, 48, 8192),  // the attachment runs past the message
        forge(100, 48, 8192),      // bytes follow the last attachment
        forge(100, 48, 100),       // a small message, the attachment cut short
    };
    for (const std::string& forged : cases) runtime().send_raw(last_rank(), forged);
    EXPECT_TRUE(store.ask(&Store::echo, pattern(100000, 1)).get() == pattern(100000, 1));
  }
  barrier();
}

// A message announcing an attachment (an MPI message of its own) that never comes: the
// receiving rank goes on receiving from other ranks, drops it after
// RuntimeOptions::attachment_timeout (3 s in these tests, main.cpp), and its sender's
// later messages, held behind it to keep their order, arrive then.
TEST(Bytes, AMessageWhoseAttachmentNeverArrivesIsDroppedWithoutStallingOtherSenders) {
  using namespace std::chrono_literals;
  if (runtime().size() < 2) GTEST_SKIP() << "needs a sender and a receiver";
  if (runtime().rank() == 0) runtime().spawn_with<Store>(last_rank(), {"awaits-attachments"});
  barrier();
  auto store = runtime().lookup<Store>("awaits-attachments");
  barrier();
  const auto start = std::chrono::steady_clock::now();
  if (runtime().rank() == 0) {
    std::string forged = Runtime::new_message();
    actors::detail::Header h;
    h.kind = actors::detail::Kind::tell;
    h.attachments = 1;
    h.attachment_tag = actors::detail::kFirstAttachmentTag + actors::detail::kAttachmentTags - 1;
    actors::detail::write_header(forged, h);
    const std::uint64_t size = 1 << 20;
    forged.append(reinterpret_cast<const char*>(&size), sizeof size);
    runtime().send_raw(last_rank(), forged);
    EXPECT_EQ(store.ask(&Store::kept_size).get(), 0u);  // waited behind the dropped message
    EXPECT_GE(std::chrono::steady_clock::now() - start, 2500ms);
  } else if (runtime().rank() != last_rank()) {
    std::this_thread::sleep_for(200ms);  // rank 0's message is held by now
    const auto asked = std::chrono::steady_clock::now();
    EXPECT_EQ(store.ask(&Store::kept_size).get(), 0u);
    EXPECT_LT(std::chrono::steady_clock::now() - asked, 2000ms) << "another sender's message was held up";
  }
  barrier();
}

TEST(Bytes, AttachmentsWithinOneMessageAndBesideItArriveIntact) {
  // Up to kAttachedLimit in all, attachments travel within their message; past it,
  // as messages of their own. Sizes either side of the limit, and several together.
  if (runtime().rank() == 0) {
    auto store = runtime().spawn<Store>(last_rank());
    const std::size_t limit = actors::detail::kAttachedLimit;
    for (std::size_t size : {actors::kInlineBytes + 1, std::size_t{65536}, limit - 200, limit, limit + 1, 2 * limit}) {
      const Bytes sent = pattern(size, static_cast<int>(size % 251));
      EXPECT_TRUE(store.ask(&Store::echo, sent).get() == sent) << size << " bytes";
    }
    std::vector<Bytes> parts = {pattern(5000, 1), pattern(4097, 2), pattern(3, 3), pattern(70000, 4)};
    std::uint64_t expected = 0;
    for (const Bytes& p : parts)
      for (std::byte b : p.span()) expected = expected * 31 + static_cast<std::uint8_t>(b);
    EXPECT_EQ(store.ask(&Store::checksum, parts).get(), expected);
  }
  barrier();
}
