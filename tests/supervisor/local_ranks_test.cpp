// LocalRanks: a pid from a Hello is signalled only when it is a rank of this launch on
// this host -- a descendant of its mpirun, over a connection from a local address.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <thread>

#include "local_ranks.hpp"

namespace sv = troupe::supervisor;
namespace ip = boost::asio::ip;
using namespace std::chrono_literals;

namespace {

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// A child that sleeps until killed; killed and reaped on destruction. Its pid is
// checked before every kill(): kill(-1, ...) would signal every process we may signal.
struct Sleeper {
  pid_t pid = ::fork();
  bool reaped = false;
  Sleeper() {
    if (pid == 0) {
      ::pause();
      ::_exit(0);
    }
    EXPECT_GT(pid, 0) << "fork failed";
  }
  ~Sleeper() {
    if (pid <= 0 || reaped) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  // Whether it ended (reaps it then).
  bool ended_within(std::chrono::milliseconds limit) {
    if (pid <= 0) return false;
    for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(5ms))
      if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        reaped = true;
        return true;
      }
    return false;
  }
};

sv::RankStatus rank_at(pid_t pid, const std::string& from, std::string host = host_name()) {
  sv::RankStatus rank;
  rank.rank = 0;
  rank.registered = rank.connected = true;
  rank.host = std::move(host);
  rank.pid = static_cast<std::uint32_t>(pid);
  rank.peer_address = ip::make_address(from);
  return rank;
}

}  // namespace

TEST(LocalRanks, APidDescendsFromItsParentAndNotTheOtherWayRound) {
  Sleeper child;
  EXPECT_TRUE(sv::descends_from(child.pid, ::getpid()));
  EXPECT_FALSE(sv::descends_from(::getpid(), child.pid));
  EXPECT_FALSE(sv::descends_from(child.pid, child.pid));
  EXPECT_FALSE(sv::descends_from(1, ::getpid()));
  EXPECT_FALSE(sv::descends_from(999999999, ::getpid())) << "no such process";
}

TEST(LocalRanks, LoopbackIsLocalAndADocumentationAddressIsNot) {
  EXPECT_TRUE(sv::is_local_address(ip::make_address("127.0.0.1")));
  EXPECT_TRUE(sv::is_local_address(ip::make_address("127.0.3.4")));
  EXPECT_TRUE(sv::is_local_address(ip::make_address("::1")));
  EXPECT_FALSE(sv::is_local_address(ip::make_address("192.0.2.1")));  // TEST-NET-1, never assigned
  EXPECT_FALSE(sv::is_local_address(ip::make_address("0.0.0.0")));
}

TEST(LocalRanks, ARankOfThisLaunchIsWatchedAndSignalled) {
  boost::asio::io_context io;
  sv::LocalRanks local(io);
  Sleeper rank;
  local.begin_launch(1, ::getpid());  // this test process stands for mpirun
  bool exited = false;
  EXPECT_EQ(local.watch(rank_at(rank.pid, "127.0.0.1"), [&] { exited = true; }), "");
  local.signal(SIGKILL);
  EXPECT_TRUE(rank.ended_within(2s));
  io.run_for(1s);
  EXPECT_TRUE(exited);
  EXPECT_TRUE(local.all_exited());
}

TEST(LocalRanks, APidOutsideTheLaunchIsNeverSignalled) {
  boost::asio::io_context io;
  sv::LocalRanks local(io);
  Sleeper bystander;  // this host, but not a descendant of the "mpirun" below
  Sleeper launcher;   // stands for mpirun; the bystander is its sibling
  local.begin_launch(1, launcher.pid);
  const std::string why = local.watch(rank_at(bystander.pid, "127.0.0.1"), [] {});
  EXPECT_NE(why.find("is not a descendant of this launch's mpirun"), std::string::npos) << why;
  local.signal(SIGKILL);
  EXPECT_FALSE(bystander.ended_within(200ms));
}

TEST(LocalRanks, ARankNamingThisHostFromAnotherAddressIsNotSignalled) {
  boost::asio::io_context io;
  sv::LocalRanks local(io);
  Sleeper rank;
  local.begin_launch(1, ::getpid());
  const std::string why = local.watch(rank_at(rank.pid, "192.0.2.1"), [] {});
  EXPECT_NE(why.find("its connection comes from 192.0.2.1, not an address of this host"), std::string::npos) << why;
  local.signal(SIGKILL);
  EXPECT_FALSE(rank.ended_within(200ms));
}

TEST(LocalRanks, ARankOfAnotherHostIsLeftToMpirunWithoutComplaint) {
  boost::asio::io_context io;
  sv::LocalRanks local(io);
  Sleeper rank;
  local.begin_launch(1, ::getpid());
  EXPECT_EQ(local.watch(rank_at(rank.pid, "192.0.2.1", "some-other-host"), [] {}), "");
  EXPECT_FALSE(local.all_exited());
}
