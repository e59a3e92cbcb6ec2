#include "troupe/supervisor/fault.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

#include "troupe/supervisor/run_environment.hpp"

namespace troupe::supervisor {
namespace {

template <class T>
T parse_number(std::string_view text, std::string_view key, std::string_view whole) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TROUPE_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && value >= T{}, kEnvFault, "='",
               whole, "': ", key, "='", text, "' is not a non-negative whole number");
  return value;
}

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

FaultPlan parse_fault(std::string_view text) {
  FaultPlan plan;
  bool has_rank = false, has_step = false, has_kind = false;
  std::string_view rest = text;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    auto eq = item.find('=');
    TROUPE_CHECK(eq != std::string_view::npos, kEnvFault, "='", text, "': '", item,
                 "' is not key=value (expected rank=R,step=S,kind=crash|hang|throw|crash_in_save|segv[,restart=N])");
    std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    auto once = [&](bool& seen) {
      TROUPE_CHECK(!seen, kEnvFault, "='", text, "': '", key, "' given twice");
      seen = true;
    };
    if (key == "rank") {
      once(has_rank);
      plan.rank = parse_number<int>(value, key, text);
    } else if (key == "step") {
      once(has_step);
      plan.step = parse_number<std::uint64_t>(value, key, text);
    } else if (key == "kind") {
      once(has_kind);
      if (value == "crash")
        plan.kind = FaultKind::crash;
      else if (value == "hang")
        plan.kind = FaultKind::hang;
      else if (value == "throw")
        plan.kind = FaultKind::throw_error;
      else if (value == "crash_in_save")
        plan.kind = FaultKind::crash_in_save;
      else if (value == "segv")
        plan.kind = FaultKind::segv;
      else
        TROUPE_CHECK(false, kEnvFault, "='", text, "': kind='", value,
                     "' is not crash, hang, throw, crash_in_save or segv");
    } else if (key == "restart") {
      TROUPE_CHECK(!plan.restart, kEnvFault, "='", text, "': 'restart' given twice");
      plan.restart = parse_number<std::uint32_t>(value, key, text);
    } else {
      TROUPE_CHECK(false, kEnvFault, "='", text, "': unknown key '", key, "' (expected rank, step, kind, restart)");
    }
  }
  TROUPE_CHECK(has_rank && has_step && has_kind, kEnvFault, "='", text, "': missing ",
               !has_rank   ? "rank"
               : !has_step ? "step"
                           : "kind",
               " (expected rank=R,step=S,kind=crash|hang|throw|crash_in_save|segv[,restart=N])");
  return plan;
}

FaultInjector::FaultInjector(std::optional<FaultPlan> plan, int rank, std::uint32_t restart) {
  if (!plan) return;
  plan_ = *plan;
  armed_ = plan_.rank == rank && (!plan_.restart || *plan_.restart == restart);
}

FaultInjector FaultInjector::from_environment(int rank) {
  const char* text = std::getenv(kEnvFault);
  if (!text || !*text) return {};
  const char* armed = std::getenv(kEnvFaultArmed);
  const auto say = [](const std::string& line) {
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  };
  if (!armed || std::string_view(armed) != "1") {
    if (rank == 0)
      say(std::string("troupe: ignoring ") + kEnvFault + "='" + text + "': fault injection is not armed (set " +
          kEnvFaultArmed + "=1 as well, or use troupe-run --fault)\n");
    return {};
  }
  const std::uint32_t restart = run_environment().restart;
  FaultInjector injector(parse_fault(text), rank, restart);
  if (rank == 0)
    say(std::string("troupe: fault injection ARMED on this launch (restart ") + std::to_string(restart) +
        "): " + kEnvFault + "='" + text + "'\n");
  return injector;
}

void FaultInjector::fire() const {
  static constexpr const char* names[] = {"crash", "hang", "throw", "crash_in_save", "segv"};
  // The time stamp lets the benchmark measure from the fault to its detection. One
  // write: std::cerr is unbuffered, and piece by piece the line interleaved with the
  // other ranks' output, so that a log reader missed it.
  std::ostringstream line;
  line << "troupe fault: " << names[static_cast<int>(plan_.kind)] << " on rank " << plan_.rank << " at step "
       << plan_.step << " (pid " << ::getpid() << ", t=" << std::fixed << seconds_since_epoch() << ")\n";
  const std::string text = line.str();
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
  switch (plan_.kind) {
    case FaultKind::crash:
    case FaultKind::crash_in_save: ::kill(::getpid(), SIGKILL); break;
    case FaultKind::hang: break;
    case FaultKind::segv: {
      // A store to a page with no access: a real fault. A null store would be undefined
      // behaviour, which UBSan reports and ends the process for before any signal.
      void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      *static_cast<volatile int*>(page) = 1;
      break;
    }
    case FaultKind::throw_error:
      TROUPE_THROW(FaultInjected, "injected fault (", kEnvFault, ") on rank ", plan_.rank, " at step ", plan_.step);
  }
  // hang, and the instant between kill() and its delivery.
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace troupe::supervisor
