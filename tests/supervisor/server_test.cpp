// HeartbeatServer against the real SupervisorClient and against hostile raw sockets,
// in one process: the server's io_context runs on its own thread, as in troupe-run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "heartbeat_server.hpp"
#include "troupe/error.hpp"
#include "troupe/supervisor/client.hpp"
#include "troupe/supervisor/protocol.hpp"

namespace sv = troupe::supervisor;
using namespace std::chrono_literals;

namespace {

// Records what the server reports; waits until a condition on the record holds.
class Recorder : public sv::HeartbeatServer::Listener {
 public:
  void on_rank_up(const sv::RankStatus& r) override { add("up " + std::to_string(r.rank)); }
  void on_rank_lost(const sv::RankStatus& r, const std::string& why) override {
    add("lost " + std::to_string(r.rank) + ": " + why);
  }
  void on_refused(const std::string&, const std::string& why) override { add("refused: " + why); }
  void on_progress(const sv::RankStatus& r) override {
    add("progress " + std::to_string(r.rank) + " step " + std::to_string(r.progress.step) + " seq " +
        std::to_string(r.progress.sequence));
  }
  // Waits up to 5 s for an event containing `text`.
  bool wait_for(const std::string& text) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 5s, [&] {
      for (auto& e : events_)
        if (e.find(text) != std::string::npos) return true;
      return false;
    });
  }
  std::vector<std::string> events() {
    std::lock_guard lock(mutex_);
    return events_;
  }

 private:
  void add(std::string e) {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(e));
    changed_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> events_;
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<sv::HeartbeatServer>(io_, "127.0.0.1", 0, "secret-token", "run-A", recorder_);
    server_->begin_launch(0, 2);
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    // The server belongs to the io thread: destroy it there, then stop.
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      server_.reset();
      done.set_value();
    });
    done.get_future().wait();
    guard_.reset();
    io_.stop();
    thread_.join();
  }
  sv::RunEnvironment env(std::string token = "secret-token") {
    sv::RunEnvironment e;
    e.supervisor = "127.0.0.1:" + std::to_string(server_->port());
    e.token = std::move(token);
    e.run_id = "run-A";
    e.heartbeat_interval = 20ms;
    return e;
  }
  // A raw socket to the server, for peers that do not follow the protocol; `from`
  // picks the source address (all of 127.0.0.0/8 is this host's loopback).
  int raw_connect(const char* from = nullptr) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (from) {
      sockaddr_in source{};
      source.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &source.sin_addr);
      EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof source), 0) << from;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return fd;
  }

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_{io_.get_executor()};
  Recorder recorder_;
  std::unique_ptr<sv::HeartbeatServer> server_;
  std::thread thread_;
};

}  // namespace

TEST_F(ServerTest, AClientRegistersReportsProgressAndSaysGoodbye) {
  {
    sv::SupervisorClient client(env(), 1, 2);
    ASSERT_TRUE(recorder_.wait_for("up 1"));
    client.report_step(41);
    client.report_collective(7);
    ASSERT_TRUE(recorder_.wait_for("progress 1 step 41 seq 7"));
    // The count is bumped after send() returns, which may be after the server saw it.
    for (int i = 0; i < 100 && client.heartbeats_sent() == 0; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_GT(client.heartbeats_sent(), 0u);
  }
  // Goodbye first, so the close that follows is not a lost rank.
  std::this_thread::sleep_for(100ms);
  for (auto& e : recorder_.events()) EXPECT_EQ(e.find("lost"), std::string::npos) << e;
}

TEST_F(ServerTest, AClientDroppedByAnExceptionIsLostAtOnce) {
  try {
    sv::SupervisorClient client(env(), 0, 2);
    ASSERT_TRUE(recorder_.wait_for("up 0"));
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(recorder_.wait_for("lost 0: connection closed without goodbye"));
}

TEST_F(ServerTest, AWrongTokenIsRefusedAndTheClientSaysWhy) {
  try {
    sv::SupervisorClient client(env("guess"), 0, 2);
    FAIL() << "a wrong token was accepted";
  } catch (const troupe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused rank 0: wrong token"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(recorder_.wait_for("refused: wrong token"));
}

TEST_F(ServerTest, RanksOutsideTheWorldOrRegisteredTwiceAreRefused) {
  EXPECT_THROW(sv::SupervisorClient(env(), 1, 3), troupe::Error);  // world of 3, the job has 2
  EXPECT_TRUE(recorder_.wait_for("refused: world size 3, the job has 2"));
  sv::SupervisorClient first(env(), 0, 2);
  EXPECT_THROW(sv::SupervisorClient(env(), 0, 2), troupe::Error);
  EXPECT_TRUE(recorder_.wait_for("refused: rank 0 is already registered"));
}

TEST_F(ServerTest, GarbageAndAHugeLengthPrefixAreRefusedAndTheServerKeepsServing) {
  int garbage = raw_connect();
  const char junk[] = "\x05\x00\x00\x00GET / HTTP/1.0\r\n\r\n";
  ::send(garbage, junk, sizeof junk - 1, 0);
  EXPECT_TRUE(recorder_.wait_for("refused: supervisor protocol: unknown message kind"));
  int huge = raw_connect();
  const unsigned char prefix[] = {0xff, 0xff, 0xff, 0x7f};
  ::send(huge, prefix, sizeof prefix, 0);
  EXPECT_TRUE(recorder_.wait_for("refused: supervisor protocol: length prefix 2147483647 exceeds"));
  int early = raw_connect();
  ::close(early);
  EXPECT_TRUE(recorder_.wait_for("refused: closed before a complete hello"));
  // The server answers refusals and closes: the garbage socket reads EOF after the reply.
  char buffer[256];
  ssize_t n;
  while ((n = ::recv(garbage, buffer, sizeof buffer, 0)) > 0) {
  }
  EXPECT_EQ(n, 0);
  ::close(garbage);
  ::close(huge);
  sv::SupervisorClient client(env(), 1, 2);  // still serving
  EXPECT_TRUE(recorder_.wait_for("up 1"));
}

namespace {

// Whether the server has answered and closed `fd` (an evicted connection reads its
// Refused frame, then EOF), waiting up to 2 s.
bool evicted(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 2000) <= 0) return false;
  char buffer[256];
  ssize_t n = 0, total = 0;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) total += n;
  return n == 0 && total > 0;
}

// Whether `fd` is still open and unanswered (a pending connection the server kept).
bool still_pending(int fd) {
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN;
}

}  // namespace

TEST_F(ServerTest, ASilentFloodFromOneAddressEvictsItsOwnOldestAndRanksStillRegister) {
  std::vector<int> silent;
  for (std::size_t i = 0; i < sv::kMaxPendingConnections + 3; ++i) silent.push_back(raw_connect());
  EXPECT_TRUE(recorder_.wait_for("refused: evicted after"));
  // The oldest went first; the newest kMaxPendingPerPeer are the ones still held.
  EXPECT_TRUE(evicted(silent.front()));
  std::this_thread::sleep_for(100ms);
  for (std::size_t i = silent.size() - sv::kMaxPendingPerPeer; i < silent.size(); ++i)
    EXPECT_TRUE(still_pending(silent[i])) << "connection " << i;
  // The flood is still there, and a rank from the same address gets in: it is newer.
  sv::SupervisorClient client(env(), 0, 2);
  EXPECT_TRUE(recorder_.wait_for("up 0"));
  for (int fd : silent) ::close(fd);
}

TEST_F(ServerTest, AFloodFromOneAddressNeverEvictsAnotherAddresssConnections) {
  std::vector<int> other_host;
  for (std::size_t i = 0; i < sv::kMaxPendingPerPeer; ++i) other_host.push_back(raw_connect("127.0.0.2"));
  std::vector<int> flood;
  for (int i = 0; i < 40; ++i) flood.push_back(raw_connect("127.0.0.3"));
  EXPECT_TRUE(recorder_.wait_for("connections from 127.0.0.3 awaited one"));
  EXPECT_TRUE(evicted(flood.front()));
  std::this_thread::sleep_for(100ms);
  for (int fd : other_host) EXPECT_TRUE(still_pending(fd));
  for (auto& e : recorder_.events()) EXPECT_EQ(e.find("from 127.0.0.2"), std::string::npos) << e;
  for (int fd : other_host) ::close(fd);
  for (int fd : flood) ::close(fd);
}

TEST_F(ServerTest, WhenEveryPendingSlotIsTakenTheOldestConnectionIsEvicted) {
  std::vector<int> held;  // kMaxPendingPerPeer from each of enough addresses to fill every slot
  for (std::size_t host = 1; held.size() < sv::kMaxPendingConnections; ++host) {
    const std::string from = "127.0.1." + std::to_string(host);
    for (std::size_t i = 0; i < sv::kMaxPendingPerPeer; ++i) held.push_back(raw_connect(from.c_str()));
  }
  std::this_thread::sleep_for(100ms);
  for (auto& e : recorder_.events()) EXPECT_EQ(e.find("evicted"), std::string::npos) << e;
  int newcomer = raw_connect("127.0.2.1");
  EXPECT_TRUE(recorder_.wait_for("the most troupe-run holds (64)"));
  EXPECT_TRUE(evicted(held.front()));
  EXPECT_TRUE(still_pending(newcomer));
  for (int fd : held) ::close(fd);
  ::close(newcomer);
}

// The lockout a tester found: rotating silent connections kept ranks from registering.
TEST_F(ServerTest, RanksRegisterWhileRotatingSilentConnectionsFloodTheServer) {
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::thread flood([&] {
    std::deque<int> open;
    while (!stop) {
      open.push_back(raw_connect());
      ++opened;
      if (open.size() > 100) {
        ::close(open.front());
        open.pop_front();
      }
    }
    for (int fd : open) ::close(fd);
  });
  while (opened < 200) std::this_thread::sleep_for(1ms);
  {
    sv::SupervisorClient rank0(env(), 0, 2);
    sv::SupervisorClient rank1(env(), 1, 2);
    EXPECT_TRUE(recorder_.wait_for("up 0"));
    EXPECT_TRUE(recorder_.wait_for("up 1"));
  }
  stop = true;
  flood.join();
}

TEST_F(ServerTest, ARankOfAnEarlierLaunchIsRefused) {
  auto e = env();
  e.restart = 3;
  try {
    sv::SupervisorClient client(e, 0, 2);
    FAIL() << "a stale rank was accepted";
  } catch (const troupe::Error& err) {
    EXPECT_NE(std::string(err.what()).find("rank from launch 3, the current launch is 0"), std::string::npos);
  }
}

TEST(SupervisorClient, FailsClearlyWhenNothingListens) {
  sv::RunEnvironment e;
  e.supervisor = "127.0.0.1:1";
  e.token = "t";
  try {
    sv::SupervisorClient client(e, 0, 1, 1s);
    FAIL() << "connected to nothing";
  } catch (const troupe::Error& err) {
    EXPECT_NE(std::string(err.what()).find("cannot connect to troupe-run at 127.0.0.1:1"), std::string::npos)
        << err.what();
  }
}

// Fencing (client.hpp): a rank troupe-run no longer answers stops itself.
namespace {

struct LostRecord {
  std::mutex mutex;
  std::condition_variable changed;
  std::string why;
  sv::SupervisorClient::LostHandler handler() {
    return [this](const std::string& w) {
      std::lock_guard lock(mutex);
      why = w;
      changed.notify_all();
    };
  }
  std::string wait(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, limit, [&] { return !why.empty(); });
    return why;
  }
};

}  // namespace

TEST_F(ServerTest, AnAnsweredClientNeverFencesItself) {
  auto e = env();
  e.supervisor_timeout = 300ms;  // 15 heartbeat intervals
  LostRecord lost;
  sv::SupervisorClient client(e, 0, 2, 10s, lost.handler());
  EXPECT_EQ(lost.wait(1500ms), "");
  EXPECT_GT(client.heartbeats_sent(), 10u);
}

TEST_F(ServerTest, AClientWhoseConnectionTroupeRunClosedFencesItself) {
  auto e = env();
  e.supervisor_timeout = 5s;
  LostRecord lost;
  sv::SupervisorClient client(e, 0, 2, 10s, lost.handler());
  ASSERT_TRUE(recorder_.wait_for("up 0"));
  boost::asio::post(io_, [this] { server_->begin_launch(1, 2); });  // a relaunch forgets the old ranks
  auto why = lost.wait(3s);  // "closed the connection", or a send that failed on the closed socket
  EXPECT_NE(why.find("troupe-run at 127.0.0.1:"), std::string::npos) << why;
}

TEST_F(ServerTest, AClientTroupeRunTellsToStopEndsItself) {
  auto e = env();
  e.supervisor_timeout = 5s;
  LostRecord lost;
  sv::SupervisorClient client(e, 0, 2, 10s, lost.handler());
  ASSERT_TRUE(recorder_.wait_for("up 0"));
  boost::asio::post(io_, [this] { server_->stop_ranks(); });
  auto why = lost.wait(3s);
  EXPECT_NE(why.find("is stopping the job"), std::string::npos) << why;
}

// A peer that welcomes the rank and then goes silent, as troupe-run behind a
// partition does: the rank fences itself after the timeout, not before.
TEST(SupervisorClientFencing, ARankThatHearsNothingStopsItselfAfterTheTimeout) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t length = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  std::thread silent([listener] {
    int fd = ::accept(listener, nullptr, nullptr);
    std::uint8_t header[sv::kFrameHeader];
    ASSERT_EQ(::recv(fd, header, sizeof header, MSG_WAITALL), static_cast<ssize_t>(sizeof header));
    std::vector<std::uint8_t> hello(sv::decode_length(header));
    ASSERT_EQ(::recv(fd, hello.data(), hello.size(), MSG_WAITALL), static_cast<ssize_t>(hello.size()));
    auto welcome = sv::encode(sv::Welcome{});
    ASSERT_EQ(::send(fd, welcome.data(), welcome.size(), 0), static_cast<ssize_t>(welcome.size()));
    std::this_thread::sleep_for(2s);  // heartbeats pile up unread; no answer
    ::close(fd);
  });
  sv::RunEnvironment e;
  e.supervisor = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  e.token = "t";
  e.run_id = "r";
  e.heartbeat_interval = 20ms;
  e.supervisor_timeout = 400ms;
  LostRecord lost;
  auto started = std::chrono::steady_clock::now();
  {
    sv::SupervisorClient client(e, 0, 1, 10s, lost.handler());
    auto why = lost.wait(1800ms);
    auto took = std::chrono::steady_clock::now() - started;
    EXPECT_NE(why.find("no answer from troupe-run"), std::string::npos) << why;
    EXPECT_GE(took, 400ms);
  }
  silent.join();
  ::close(listener);
}
