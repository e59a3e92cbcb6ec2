// supervisor_bench: what being supervised costs a rank.
//
//   supervisor_bench [--quick] [--json FILE]
//
// 1. The per-step calls, report_step + report_collective (two relaxed atomics).
// 2. The heartbeat thread's CPU: the process's CPU time while its main thread sleeps,
//    with a client heartbeating to a server in another process (so the server's CPU
//    is not counted), at troupe-run's most frequent interval (0.1 s) and at 20 ms,
//    against the same process sleeping without a client.
// 3. End to end: a CPU-bound step (~0.3 ms of float work) timed with a heartbeating
//    client (every 0.1 s, troupe-run's interval) and the per-step reports, against
//    the same step unsupervised, in
//    alternating rounds (median), the "< 1% of step time".
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "heartbeat_server.hpp"
#include "troupe/supervisor/client.hpp"

namespace sv = troupe::supervisor;
using Clock = std::chrono::steady_clock;

namespace {

struct Quiet : sv::HeartbeatServer::Listener {
  void on_rank_up(const sv::RankStatus&) override {}
  void on_rank_lost(const sv::RankStatus&, const std::string&) override {}
  void on_refused(const std::string&, const std::string&) override {}
  void on_progress(const sv::RankStatus&) override {}
};

// Forks a process that serves heartbeats on a free port; returns (pid, port).
std::pair<pid_t, unsigned short> start_server() {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    boost::asio::io_context io;
    Quiet quiet;
    sv::HeartbeatServer server(io, "127.0.0.1", 0, "bench-token", "bench", quiet);
    server.begin_launch(0, 1);
    unsigned short port = server.port();
    if (::write(fds[1], &port, sizeof port) != sizeof port) ::_exit(1);
    ::close(fds[1]);
    io.run();
    ::_exit(0);
  }
  ::close(fds[1]);
  unsigned short port = 0;
  if (::read(fds[0], &port, sizeof port) != sizeof port) throw std::runtime_error("server did not start");
  ::close(fds[0]);
  return {pid, port};
}

// A new server per client: the server accepts one registration per rank per launch.
struct Server {
  Server() { std::tie(pid, port) = start_server(); }
  ~Server() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  sv::RunEnvironment env(std::chrono::milliseconds interval) const {
    sv::RunEnvironment e;
    e.supervisor = "127.0.0.1:" + std::to_string(port);
    e.token = "bench-token";
    e.run_id = "bench";
    e.heartbeat_interval = interval;
    return e;
  }
  pid_t pid;
  unsigned short port;
};

double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The stand-in for a training step: float work (~0.3 ms here), shorter than a real
// step, so that any per-step cost shows more, not less.
float step_work(std::vector<float>& data) {
  float acc = 0;
  for (int pass = 0; pass < 4; ++pass)
    for (std::size_t i = 0; i < data.size(); ++i) {
      data[i] = data[i] * 0.999f + 0.001f;
      acc += data[i];
    }
  return acc;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::cerr << "usage: supervisor_bench [--quick] [--json FILE]\n";
      return 2;
    }
  }
  // Measurements as "name": value; bench/run pairs them into result rows.
  std::vector<std::string> rows;
  auto add = [&](const std::string& name, double value) {
    char buffer[256];
    std::snprintf(buffer, sizeof buffer, "\"%s\": %.6g", name.c_str(), value);
    rows.push_back(buffer);
  };

  // 1. The per-step calls.
  {
    Server server;
    sv::SupervisorClient client(server.env(std::chrono::milliseconds(100)), 0, 1);
    const std::uint64_t n = quick ? 2'000'000 : 20'000'000;
    auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < n; ++i) {
      client.report_step(i);
      client.report_collective(2 * i);
    }
    double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
    add("report_ns", ns);
    std::fprintf(stderr, "report calls: %.2f ns per step\n", ns);
  }

  // 2. Heartbeat thread CPU while the rank's main thread sleeps.
  const double idle_s = quick ? 1.0 : 3.0;
  {
    // The baseline: the same process sleeping without a client.
    double c0 = process_cpu_s();
    std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
    add("idle_cpu_us_per_s", (process_cpu_s() - c0) / idle_s * 1e6);
  }
  for (int interval_ms : {100, 20}) {
    Server server;
    sv::SupervisorClient client(server.env(std::chrono::milliseconds(interval_ms)), 0, 1);
    double c0 = process_cpu_s();
    std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
    double us_per_s = (process_cpu_s() - c0) / idle_s * 1e6;
    add("heartbeat_cpu_us_per_s_" + std::to_string(interval_ms) + "ms", us_per_s);
    std::fprintf(stderr, "heartbeat every %d ms: %.1f us CPU per s (%lu sent)\n", interval_ms, us_per_s,
                 static_cast<unsigned long>(client.heartbeats_sent()));
  }

  // 3. Step time with and without supervision, alternating rounds.
  {
    std::vector<float> data(1 << 17, 1.0f);
    volatile float sink = 0;
    auto t0 = Clock::now();
    int calibrate = 0;
    while (Clock::now() - t0 < std::chrono::milliseconds(200)) {
      sink = sink + step_work(data);
      ++calibrate;
    }
    const int steps = std::max(50, static_cast<int>((quick ? 0.3 : 1.0) * calibrate / 0.2));
    const int rounds = quick ? 3 : 9;
    std::vector<double> plain, supervised;
    Server server;
    // troupe-run's interval: heartbeat_timeout / 5, at most 0.1 s.
    sv::SupervisorClient client(server.env(std::chrono::milliseconds(100)), 0, 1);
    for (int r = 0; r < rounds; ++r) {
      for (int with : {r % 2, 1 - r % 2}) {
        auto s0 = Clock::now();
        for (int i = 0; i < steps; ++i) {
          if (with) {
            client.report_step(static_cast<std::uint64_t>(i));
            client.report_collective(static_cast<std::uint64_t>(i));
          }
          sink = sink + step_work(data);
        }
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - s0).count() / steps;
        (with ? supervised : plain).push_back(ms);
      }
    }
    double p = median(plain), s = median(supervised);
    double overhead = (s - p) / p * 100;
    add("step_ms_plain", p);
    add("step_ms_supervised", s);
    std::fprintf(stderr, "step %.4f ms supervised vs %.4f ms plain: %+.2f%%\n", s, p, overhead);
  }

  std::string json = "{\n";
  for (std::size_t i = 0; i < rows.size(); ++i) json += "  " + rows[i] + (i + 1 < rows.size() ? ",\n" : "\n");
  json += "}\n";
  if (json_path.empty())
    std::cout << json;
  else
    std::ofstream(json_path) << json;
  return 0;
}
