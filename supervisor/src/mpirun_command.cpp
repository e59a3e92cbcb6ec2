#include "mpirun_command.hpp"

#include <algorithm>

namespace troupe::supervisor {

std::vector<std::string> mpirun_command(const RunOptions& options, const std::string& mpirun,
                                        const std::vector<std::string>& exported, unsigned cores) {
  std::vector<std::string> command = {mpirun, "-np", std::to_string(options.np)};
  auto given = [&](std::initializer_list<const char*> flags) {
    return std::any_of(options.mpirun_args.begin(), options.mpirun_args.end(), [&](const std::string& arg) {
      return std::any_of(flags.begin(), flags.end(), [&](const char* f) { return arg == f; });
    });
  };
  bool hosts = given({"--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host", "-host", "-H"});
  bool policy = given({"--oversubscribe", "-oversubscribe", "--nooversubscribe"});
  if (static_cast<unsigned>(options.np) > cores && !hosts && !policy) command.push_back("--oversubscribe");
  command.insert(command.end(), options.mpirun_args.begin(), options.mpirun_args.end());
  for (const auto& name : exported) {
    command.push_back("-x");
    command.push_back(name);
  }
  command.insert(command.end(), options.program.begin(), options.program.end());
  return command;
}

RunOptions launch_options(const RunOptions& options, const HostPool& pool, const std::string& hostfile) {
  RunOptions launch = options;
  launch.np = pool.np();
  if (!pool.hosts_changed()) return launch;
  static const std::vector<std::string> host_flags = {
      "--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host", "-host", "-H"};
  launch.mpirun_args.clear();
  for (std::size_t i = 0; i < options.mpirun_args.size(); ++i) {
    if (std::find(host_flags.begin(), host_flags.end(), options.mpirun_args[i]) != host_flags.end()) {
      ++i;  // and its value
      continue;
    }
    launch.mpirun_args.push_back(options.mpirun_args[i]);
  }
  pool.write_hostfile(hostfile);
  launch.mpirun_args.push_back("--hostfile");
  launch.mpirun_args.push_back(hostfile);
  return launch;
}

std::vector<std::string> probe_command(const RunOptions& options, const std::string& mpirun, const std::string& host) {
  // Options that place ranks make no sense for one process on a named host.
  static const std::vector<std::string> dropped = {
      "--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host",    "-host", "-H",
      "--map-by",   "-map-by",   "--rank-by",     "--npernode",   "-npernode", "-N",    "--output-filename"};
  std::vector<std::string> command = {mpirun, "--host", host + ":1", "-np", "1"};
  for (std::size_t i = 0; i < options.mpirun_args.size(); ++i) {
    if (std::find(dropped.begin(), dropped.end(), options.mpirun_args[i]) != dropped.end()) {
      ++i;
      continue;
    }
    command.push_back(options.mpirun_args[i]);
  }
  command.push_back("true");
  return command;
}

}  // namespace troupe::supervisor
