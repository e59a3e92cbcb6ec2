#include "troupe/supervisor/mpirun_command.hpp"

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

}  // namespace troupe::supervisor
