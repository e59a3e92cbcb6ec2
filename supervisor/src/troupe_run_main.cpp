// troupe-run: runs an MPI job under supervision and relaunches it when a rank dies,
// hangs or stops heartbeating. See run_options.hpp for the command line and
// supervisor.hpp for what happens.
#include <signal.h>

#include <iostream>
#include <string>
#include <vector>

#include "dump_summary.hpp"
#include "run_options.hpp"
#include "status_view.hpp"
#include "supervisor.hpp"
#include "troupe/error.hpp"
#include "troupe/version.hpp"

int main(int argc, char** argv) {
  using namespace troupe::supervisor;
  if (argc >= 2 && std::string(argv[1]) == "status") {
    if (argc != 3) {
      std::cerr << "troupe-run: error: usage: troupe-run status DIR (the job's --checkpoint-dir)\n";
      return 2;
    }
    return print_status(argv[2], std::cout);
  }
  if (argc >= 2 && std::string(argv[1]) == "dump") {
    if (argc != 3) {
      std::cerr << "troupe-run: error: usage: troupe-run dump DIR (the job's --checkpoint-dir)\n";
      return 2;
    }
    return request_dump(argv[2], std::cout);
  }
  RunOptions options;
  try {
    options = parse_run_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const troupe::InvalidArgument& e) {
    std::cerr << "troupe-run: error: " << e.what() << "\n\n" << usage();
    return 2;
  }
  if (options.help) {
    std::cout << usage();
    return 0;
  }
  if (options.version) {
    std::cout << "troupe-run (troupe) " << troupe::version() << "\n";
    return 0;
  }
  // A rank that vanishes mid-write must not kill troupe-run (Asio sends with
  // MSG_NOSIGNAL already; this covers every other write).
  ::signal(SIGPIPE, SIG_IGN);
  try {
    Supervisor supervisor(std::move(options));
    return supervisor.run();
  } catch (const troupe::InvalidArgument& e) {  // the hosts or addresses given cannot work
    std::cerr << "troupe-run: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "troupe-run: error: " << e.what() << "\n";
    return 3;
  }
}
