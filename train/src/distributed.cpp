#include "troupe/train/distributed.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "troupe/error.hpp"

namespace troupe::train {

namespace {
// A non-negative integer from the environment, or `fallback` when unset; a value
// that is not a number is an error naming the variable (a broken launcher).
int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  TROUPE_CHECK(errno == 0 && *end == '\0' && value >= 0 && value < (1L << 30), "environment variable ", name, " is '",
               text, "', not a rank");
  return static_cast<int>(value);
}
}  // namespace

int local_rank() { return env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0); }
int local_size() { return env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1); }
int global_rank() { return env_int("OMPI_COMM_WORLD_RANK", 0); }

int device_for_local_rank(int visible_devices) {
  if (visible_devices <= 0) return -1;
  return local_rank() % visible_devices;
}

double reduce_sum(collectives::Communicator& comm, double value) {
  comm.allreduce(collectives::Buffer(&value, 1), collectives::ReduceOp::sum);
  return value;
}

double reduce_mean(collectives::Communicator& comm, double value) {
  comm.allreduce(collectives::Buffer(&value, 1), collectives::ReduceOp::avg);
  return value;
}

std::vector<double> gather(collectives::Communicator& comm, double value) {
  return gather(comm, std::vector<double>{value});
}

std::vector<double> gather(collectives::Communicator& comm, const std::vector<double>& values) {
  std::vector<double> input = values;
  std::vector<double> out(values.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(collectives::Buffer(input), collectives::Buffer(out));
  return out;
}

}  // namespace troupe::train
