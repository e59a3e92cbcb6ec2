#include "run_options.hpp"

#include <tuple>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <string_view>

#include "troupe/error.hpp"
#include "troupe/supervisor/fault.hpp"

namespace troupe::supervisor {
namespace {

// mpirun (Open MPI 4.1) options troupe-run passes through, with how many values each
// takes. Kept to the ones a training job plausibly needs; -np is troupe-run's own.
const std::map<std::string, int>& mpirun_options() {
  static const std::map<std::string, int> options = {
      {"--hostfile", 1},
      {"-hostfile", 1},
      {"--machinefile", 1},
      {"-machinefile", 1},
      {"--host", 1},
      {"-host", 1},
      {"-H", 1},
      {"--mca", 2},
      {"-mca", 2},
      {"--gmca", 2},
      {"-x", 1},
      {"--map-by", 1},
      {"-map-by", 1},
      {"--bind-to", 1},
      {"-bind-to", 1},
      {"--rank-by", 1},
      {"--npernode", 1},
      {"-npernode", 1},
      {"-N", 1},
      {"--prefix", 1},
      {"--wdir", 1},
      {"-wdir", 1},
      {"--output-filename", 1},
      {"--oversubscribe", 0},
      {"-oversubscribe", 0},
      {"--tag-output", 0},
      {"-tag-output", 0},
      {"--timestamp-output", 0},
      {"--report-bindings", 0},
      {"--display-map", 0},
      {"--nooversubscribe", 0},
      {"--use-hwthread-cpus", 0},
      {"-q", 0},
      {"--quiet", 0},
  };
  return options;
}

int parse_int(const std::string& flag, const std::string& text, int min) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TROUPE_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && value >= min, flag, " '", text,
               "': expected a whole number >= ", min);
  return value;
}

Seconds parse_seconds(const std::string& flag, const std::string& text, bool allow_zero) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TROUPE_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && std::isfinite(value) &&
                   (allow_zero ? value >= 0 : value > 0) && value <= 1e6,
               flag, " '", text, "': expected seconds, a number ", allow_zero ? ">= 0" : "> 0");
  return Seconds(value);
}

// ADDR:PORT (an IPv6 address in brackets) for `flag`; port 0 picks a free one.
std::pair<std::string, unsigned short> parse_address(const std::string& flag, const std::string& text) {
  auto colon = text.rfind(':');
  TROUPE_CHECK(colon != std::string::npos && colon > 0, flag, " '", text,
               "': expected ADDR:PORT (port 0 picks a free one)");
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = parse_int(flag + " port", text.substr(colon + 1), 0);
  TROUPE_CHECK(port <= 65535, flag, " '", text, "': port ", port, " is above 65535");
  return {host, static_cast<unsigned short>(port)};
}

}  // namespace

RunOptions parse_run_options(const std::vector<std::string>& args) {
  RunOptions options;
  std::size_t i = 0;
  auto value = [&](const std::string& flag) -> const std::string& {
    TROUPE_CHECK(i + 1 < args.size() && args[i + 1] != "--", flag, " needs a value");
    return args[++i];
  };
  bool separator = false;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      separator = true;
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      return options;
    } else if (arg == "--version") {
      options.version = true;
      return options;
    } else if (arg == "-np" || arg == "-n" || arg == "--np") {
      options.np = parse_int(arg, value(arg), 1);
    } else if (arg == "--max-restarts") {
      options.max_restarts = parse_int(arg, value(arg), 0);
    } else if (arg == "--checkpoint-dir") {
      options.checkpoint_dir = value(arg);
      TROUPE_CHECK(!options.checkpoint_dir.empty(), "--checkpoint-dir: empty path");
    } else if (arg == "--hang-timeout") {
      options.hang_timeout = parse_seconds(arg, value(arg), false);
    } else if (arg == "--heartbeat-timeout") {
      options.heartbeat_timeout = parse_seconds(arg, value(arg), false);
    } else if (arg == "--liveness-timeout") {
      options.liveness_timeout = parse_seconds(arg, value(arg), false);
    } else if (arg == "--backoff") {
      options.backoff = parse_seconds(arg, value(arg), true);
    } else if (arg == "--grace") {
      options.grace = parse_seconds(arg, value(arg), true);
    } else if (arg == "--bind") {
      std::tie(options.bind_host, options.bind_port) = parse_address(arg, value(arg));
    } else if (arg == "--metrics") {
      std::tie(options.metrics_host, options.metrics_port) = parse_address(arg, value(arg));
      options.metrics = true;
    } else if (arg == "--phase-timeout") {
      const std::string& text = value(arg);
      auto equals = text.find('=');
      TROUPE_CHECK(equals != std::string::npos, "--phase-timeout '", text, "': expected PHASE=SECONDS");
      options.phase_timeouts[parse_phase(text.substr(0, equals))] =
          parse_seconds("--phase-timeout " + text.substr(0, equals), text.substr(equals + 1), false);
    } else if (arg == "--advertise") {
      options.advertise = value(arg);
      TROUPE_CHECK(!options.advertise.empty(), "--advertise: empty address");
    } else if (arg == "--exclude-after") {
      options.exclude_after = parse_int(arg, value(arg), 0);
    } else if (arg == "--min-ranks") {
      options.min_ranks = parse_int(arg, value(arg), 1);
    } else if (arg == "--host-wait") {
      options.host_wait = parse_seconds(arg, value(arg), true);
    } else if (arg == "--storage-wait") {
      options.storage_wait = parse_seconds(arg, value(arg), true);
    } else if (arg == "--regrow") {
      options.regrow = true;
    } else if (arg == "--probe-interval") {
      options.probe_interval = parse_seconds(arg, value(arg), false);
    } else if (arg == "--straggler-ratio") {
      const std::string& text = value(arg);
      double ratio = -1;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ratio);
      TROUPE_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() &&
                       (ratio == 0 || (ratio > 1 && ratio <= 1000)),
                   arg, " '", text, "': expected a ratio above 1 (e.g. 1.5), or 0 to turn the report off");
      options.straggler_ratio = ratio;
    } else if (arg == "--fault") {
      options.fault = value(arg);
      parse_fault(options.fault);  // a typo fails here, not on every rank of every launch
    } else if (arg == "--trace") {
      options.trace_dir = value(arg);
      TROUPE_CHECK(!options.trace_dir.empty(), "--trace: empty path");
      options.trace_dir = std::filesystem::absolute(options.trace_dir).lexically_normal().string();
    } else if (arg == "--trace-steps") {
      const std::string& text = value(arg);
      const auto dash = text.find('-');
      const auto digits = [](std::string_view part) {
        return !part.empty() && part.size() < 18 && part.find_first_not_of("0123456789") == std::string_view::npos;
      };
      TROUPE_CHECK(digits(std::string_view(text).substr(0, dash)) &&
                       (dash == std::string::npos || digits(std::string_view(text).substr(dash + 1))),
                   arg, " '", text, "': expected FIRST-LAST or STEP (e.g. 3-5)");
      options.trace_steps = text;
    } else if (arg == "--events") {
      options.events_file = value(arg);
      TROUPE_CHECK(!options.events_file.empty(), "--events: empty path");
    } else if (auto known = mpirun_options().find(arg); known != mpirun_options().end()) {
      options.mpirun_args.push_back(arg);
      for (int k = 0; k < known->second; ++k) options.mpirun_args.push_back(value(arg));
    } else if (!arg.empty() && arg[0] == '-') {
      TROUPE_CHECK(false, "unknown option '", arg,
                   "' (mpirun options passed through: --hostfile, --host, --mca, -x, --map-by, "
                   "--bind-to, --oversubscribe and a few more; see --help)");
    } else {
      TROUPE_CHECK(false, "unexpected argument '", arg, "': the program and its arguments go after '--'");
    }
  }
  TROUPE_CHECK(options.np > 0, "-np N is required (the number of ranks)");
  TROUPE_CHECK(options.min_ranks <= options.np, "--min-ranks ", options.min_ranks, " is above -np ", options.np);
  TROUPE_CHECK(!options.regrow || !options.checkpoint_dir.empty(),
               "--regrow needs --checkpoint-dir: the job grows back at its next checkpoint");
  TROUPE_CHECK(!options.regrow || options.exclude_after > 0,
               "--regrow needs --exclude-after K: only a host left out can come back");
  TROUPE_CHECK(separator && i < args.size(), "no program given: put it after '--', e.g. troupe-run -np ", options.np,
               " -- ./train");
  options.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return options;
}

Seconds phase_timeout(const RunOptions& options, Phase phase) {
  if (auto given = options.phase_timeouts.find(phase); given != options.phase_timeouts.end()) return given->second;
  double fallback = 0;
  switch (phase) {
    case Phase::training: return options.hang_timeout;
    case Phase::startup: fallback = 600; break;
    case Phase::evaluation:
    case Phase::data_loading: fallback = 1800; break;
    case Phase::checkpoint_save:
    case Phase::checkpoint_load: fallback = 3600; break;
  }
  return Seconds(std::max(fallback, options.hang_timeout.count()));
}

std::string usage() {
  return R"(usage: troupe-run -np N [options] [mpirun options] -- program [args...]
       troupe-run status DIR
       troupe-run dump DIR

Runs `mpirun -np N program args...`, watches every rank through heartbeats, and
relaunches the whole job when a rank dies, hangs or stops heartbeating. The program
resumes from its latest checkpoint by itself (TROUPE_CHECKPOINT_DIR, TROUPE_RESTART).

options:
  -np N                   ranks (required)
  --version               print troupe's version and exit
  --max-restarts K        relaunches before giving up (default 3)
  --checkpoint-dir DIR    exported to ranks as TROUPE_CHECKPOINT_DIR (created if missing)
  --hang-timeout S        no progress (step or collective) in training for S seconds is a
                          hang (default 180)
  --phase-timeout P=S     the deadline of phase P: startup (default 600), evaluation and
                          data_loading (1800), checkpoint_save and checkpoint_load (3600)
  --heartbeat-timeout S   no heartbeat for S seconds is a dead rank (default 1.5); a rank
                          that hears nothing from troupe-run for as long stops itself
  --liveness-timeout S    ranks call a peer they have not heard from for S seconds lost
                          (default: the program's, 1 s for troupe's runtime)
  --backoff S             wait before a relaunch: S * 2^(n-1), at most 60 s, n the failures
                          in a row with no new checkpoint (default 1)
  --grace S               SIGTERM to SIGKILL when stopping the job (default 3)
  --bind ADDR:PORT        heartbeat server address (default: 127.0.0.1:0 when every rank
                          is on this host, 0.0.0.0:0 when --hostfile, --host or a Slurm
                          allocation names other hosts; port 0 picks a free one)
  --metrics ADDR:PORT     serve Prometheus metrics at http://ADDR:PORT/metrics (default:
                          off; port 0 picks a free one, printed and logged; the list
                          is docs/OBSERVABILITY.md's)
  --advertise ADDR        the address ranks connect to (default: the bound one, or this
                          host's address on the route to the job's other hosts)
  --exclude-after K       leave out a host blamed for K failures (default 0: never)
  --min-ranks M           relaunch with fewer ranks, down to M, when hosts were left out
                          (default: -np, no shrink); the program resumes resharded
  --host-wait S           after a launch that failed before its ranks started, wait up to S s
                          for every host of the next launch to answer (probed, the blamed
                          one first); if one did not answer at first, the launch is not
                          counted as a restart (default 120; 0: off)
  --storage-wait S        after the job stopped on failed saves, wait up to S s for the
                          checkpoint folder to have room for another checkpoint before
                          giving up (default 10; 0: give up at once)
  --regrow                grow back onto a host left out once it answers again (probed
                          every --probe-interval S, default 5), at the next checkpoint
  --straggler-ratio R     report a rank whose own work per step is R times the ranks'
                          median as a straggler, without restarting (default 1.5; 0: off)
  --events FILE           JSONL events log (default DIR/troupe-run-events.jsonl)
  --trace DIR             TrainWorker programs write a timeline of steps --trace-steps
                          FIRST-LAST (default 3-5) to DIR/trace.json (Perfetto, Chrome)
  --fault SPEC            inject a fault for a drill or test: TROUPE_FAULT=SPEC, armed
                          (rank=R,step=S,kind=crash|hang|throw|crash_in_save|segv[,restart=N])

troupe-run status DIR   prints the actors of the job running with --checkpoint-dir DIR, rank
                        by rank (state, mailbox depth, the method running and for how long),
                        from the snapshots its ranks write every second

troupe-run dump DIR     asks the troupe-run of the job running with --checkpoint-dir DIR for
                        every rank's thread stacks and last collectives (as on a hang) and
                        prints where each rank is; the files land in DIR/troupe-run-dumps

mpirun options passed through: --hostfile F, --host H, --mca K V, -x VAR, --map-by X,
  --bind-to X, --rank-by X, --npernode N, --prefix P, --wdir D, --oversubscribe,
  --tag-output, --timestamp-output, --report-bindings, --display-map, ...

exit status: 0 the job finished; 1 it failed max-restarts+1 times; 2 bad command line;
  3 troupe-run could not start (no mpirun, address in use); 128+signal when stopped by
  SIGINT/SIGTERM/SIGHUP. If troupe-run itself is killed, mpirun gets SIGTERM and ends
  the job.
)";
}

}  // namespace troupe::supervisor
