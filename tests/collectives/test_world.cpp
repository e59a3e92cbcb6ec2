#include "test_world.hpp"

#include <cmath>
#include <cstring>
#include <memory>

#include "troupe/mpi/environment.hpp"
#include "troupe/tensor/half.hpp"

namespace troupe::collectives::testing {

namespace {
enum World { kDefault, kMpiOnly, kTinySlots, kRing, kWorlds };

std::unique_ptr<MpiCommunicator>& world_slot(World which) {
  static std::unique_ptr<MpiCommunicator> worlds[kWorlds];
  return worlds[which];
}

MpiCommunicator& world_of(World which) {
  auto& slot = world_slot(which);
  if (slot) return *slot;
  Options options = test_options();
  if (which == kMpiOnly) options.shared_memory = false;
  if (which == kTinySlots) {
    options.shm_slot_bytes = 24;
    options.shm_slots = 2;
  }
  if (which == kRing) {
    options.shared_memory = false;
    options.ring_threshold_bytes = 0;
    options.segment_bytes = 24;
    options.ring_window = 2;
  }
  slot = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
  return *slot;
}
}  // namespace

MpiCommunicator& world() { return world_of(kDefault); }
MpiCommunicator& mpi_world() { return world_of(kMpiOnly); }
MpiCommunicator& tiny_slot_world() { return world_of(kTinySlots); }
MpiCommunicator& ring_world() { return world_of(kRing); }

bool world_on_one_node() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0, world_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  return node_size == world_size;
}

void release_world() {
  for (int w = 0; w < kWorlds; ++w) world_slot(static_cast<World>(w)).reset();
}

Options test_options() {
  Options options;
  options.timeout = std::chrono::seconds(60);
  options.progress_thread = true;
  return options;
}

Data::Data(DType dtype, std::size_t count)
    : dtype(dtype), count(count), bytes(count * tensor::element_size(dtype) + 1) {}

double Data::get(std::size_t i) const {
  return tensor::dispatch(dtype, [&](auto t) -> double {
    using T = decltype(t);
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    return static_cast<double>(static_cast<tensor::compute_t<T>>(v));
  });
}

void Data::set(std::size_t i, double value) {
  tensor::dispatch(dtype, [&](auto t) {
    using T = decltype(t);
    const T v = static_cast<T>(static_cast<tensor::compute_t<T>>(value));
    std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
  });
}

double value(Pattern pattern, DType dtype, int rank, std::size_t i) {
  const std::size_t k = i * 7 + static_cast<std::size_t>(rank) * 3;
  if (pattern == Pattern::mixed) {
    const double v = static_cast<double>(k % 11);
    return dtype == DType::u8 ? v : v - 5;
  }
  switch ((i + static_cast<std::size_t>(rank)) % 3) {
    case 0: return 2;
    case 1: return 1;
    default: return dtype == DType::u8 ? 1 : -1;
  }
}

Pattern pattern_for(ReduceOp op) { return op == ReduceOp::prod ? Pattern::factors : Pattern::mixed; }

Data input_of(Pattern pattern, DType dtype, int rank, std::size_t count, std::size_t first) {
  Data d(dtype, count);
  for (std::size_t i = 0; i < count; ++i) d.set(i, value(pattern, dtype, rank, first + i));
  return d;
}

double reduced(ReduceOp op, Pattern pattern, DType dtype, int size, std::size_t i) {
  double acc = value(pattern, dtype, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = value(pattern, dtype, r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += v; break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::max: acc = std::max(acc, v); break;
      case ReduceOp::min: acc = std::min(acc, v); break;
    }
  }
  return op == ReduceOp::avg ? acc / size : acc;
}

double tolerance(ReduceOp op, DType dtype) {
  if (op != ReduceOp::avg) return 0.0;  // small integers: exact in every dtype
  switch (dtype) {
    case DType::f16: return 2.0 / 1024;
    case DType::bf16: return 2.0 / 128;
    case DType::f32: return 1e-6;
    default: return 1e-12;
  }
}

std::string dtype_label(DType dtype) { return std::string(tensor::dtype_name(dtype)); }

}  // namespace troupe::collectives::testing
