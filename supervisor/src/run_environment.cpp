#include "troupe/supervisor/run_environment.hpp"

#include <charconv>
#include <cstdlib>

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

}  // namespace

RunEnvironment run_environment() {
  RunEnvironment env;
  env.supervisor = variable(kEnvSupervisor);
  env.token = variable(kEnvRunToken);
  env.run_id = variable(kEnvRunId);
  env.checkpoint_dir = variable(kEnvCheckpointDir);
  if (auto text = variable(kEnvRestart); !text.empty())
    env.restart = static_cast<std::uint32_t>(number(kEnvRestart, text, 1u << 30));
  if (auto text = variable(kEnvHeartbeatInterval); !text.empty()) {
    auto ms = number(kEnvHeartbeatInterval, text, 3'600'000);
    TROUPE_CHECK(ms > 0, kEnvHeartbeatInterval, "='", text, "' must be positive");
    env.heartbeat_interval = std::chrono::milliseconds(ms);
  }
  if (auto text = variable(kEnvSupervisorTimeout); !text.empty())
    env.supervisor_timeout = std::chrono::milliseconds(number(kEnvSupervisorTimeout, text, 86'400'000));
  TROUPE_CHECK(env.supervisor.empty() || !env.token.empty(), kEnvSupervisor, "='", env.supervisor,
               "' is set but ", kEnvRunToken, " is not: both come from troupe-run");
  return env;
}

}  // namespace troupe::supervisor
