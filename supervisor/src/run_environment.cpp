#include "troupe/supervisor/run_environment.hpp"

#include <unistd.h>  // environ (g++ defines _GNU_SOURCE)

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string_view>

#include "troupe/error.hpp"

namespace troupe::supervisor {
namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

std::uint64_t number(const char* name, const std::string& text, std::uint64_t max) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TROUPE_CHECK(ec == std::errc() && end == text.data() + text.size() && value <= max, name, "='", text,
               "' is not a whole number in 0..", max);
  return value;
}

std::string random_hex(std::size_t bytes) {
  std::random_device device;  // the kernel's CSPRNG on Linux
  std::string out;
  static const char digits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < bytes; ++i) {
    auto b = static_cast<unsigned>(device()) & 0xffu;
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

}  // namespace

std::string new_run_id() {
  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  return std::string(stamp) + "-" + random_hex(3);
}

std::string new_run_token() { return random_hex(16); }

RunEnvironment run_environment() {
  RunEnvironment env;
  env.supervisor = variable(kEnvSupervisor);
  env.token = variable(kEnvRunToken);
  env.run_id = variable(kEnvRunId);
  env.checkpoint_dir = variable(kEnvCheckpointDir);
  env.trace_dir = variable(kEnvTraceDir);
  env.trace_steps = variable(kEnvTraceSteps);
  if (auto text = variable(kEnvCheckpointStep); !text.empty())
    env.checkpoint_step = static_cast<long long>(number(kEnvCheckpointStep, text, 999'999'999));
  if (auto text = variable(kEnvRestart); !text.empty())
    env.restart = static_cast<std::uint32_t>(number(kEnvRestart, text, 1u << 30));
  if (auto text = variable(kEnvHeartbeatInterval); !text.empty()) {
    auto ms = number(kEnvHeartbeatInterval, text, 3'600'000);
    TROUPE_CHECK(ms > 0, kEnvHeartbeatInterval, "='", text, "' must be positive");
    env.heartbeat_interval = std::chrono::milliseconds(ms);
  }
  if (auto text = variable(kEnvSupervisorTimeout); !text.empty())
    env.supervisor_timeout = std::chrono::milliseconds(number(kEnvSupervisorTimeout, text, 86'400'000));
  TROUPE_CHECK(env.supervisor.empty() || !env.token.empty(), kEnvSupervisor, "='", env.supervisor, "' is set but ",
               kEnvRunToken, " is not: both come from troupe-run");
  return env;
}

LaunchEnvironment launch_environment(const RunEnvironment& run, std::chrono::milliseconds liveness_timeout) {
  LaunchEnvironment launch;
  const auto set = [&](const char* name, std::string value) {
    launch.variables.emplace_back(name, std::move(value));
    launch.exported.emplace_back(name);
  };
  set(kEnvSupervisor, run.supervisor);
  set(kEnvRunToken, run.token);
  set(kEnvRunId, run.run_id);
  set(kEnvRestart, std::to_string(run.restart));
  set(kEnvHeartbeatInterval, std::to_string(run.heartbeat_interval.count()));
  set(kEnvSupervisorTimeout, std::to_string(run.supervisor_timeout.count()));
  if (!run.checkpoint_dir.empty()) {
    set(kEnvCheckpointDir, run.checkpoint_dir);
    set(kEnvStatusDir, run.checkpoint_dir + "/troupe-run-status");
  }
  if (run.checkpoint_step >= 0) set(kEnvCheckpointStep, std::to_string(run.checkpoint_step));
  if (!run.trace_dir.empty()) set(kEnvTraceDir, run.trace_dir);
  if (!run.trace_steps.empty()) set(kEnvTraceSteps, run.trace_steps);
  if (liveness_timeout.count() > 0) set(kEnvLivenessTimeout, std::to_string(liveness_timeout.count()));
  if (!run.fault.empty()) {
    set(kEnvFault, run.fault);
    set(kEnvFaultArmed, "1");
  }
  // What picks the numerics (BLAS kernels and threads) and troupe's own settings
  // travel with the ranks: a node's login environment may pick other GEMM kernels,
  // and a rank placed there would then compute other bits than the same rank here.
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string name(text.substr(0, text.find('=')));
    const bool forwarded = name.starts_with("TROUPE_") || name.starts_with("OPENBLAS_") || name.starts_with("OMP_");
    if (forwarded && std::find(launch.exported.begin(), launch.exported.end(), name) == launch.exported.end())
      launch.exported.push_back(name);
  }
  if (::geteuid() == 0) {  // Open MPI refuses root unless told twice that it is meant
    launch.variables.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
    launch.variables.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  return launch;
}

}  // namespace troupe::supervisor
