// The parallel save against the gathered save and the disk, in one MPI job so all see
// the same page cache and disk state. Run under mpirun (bench/run runs it at 2 ranks);
// rank 0 prints one JSON object.
//
//   mpirun -np 2 checkpoint_parallel_bench [--mb 300] [--rounds 5] [--dir PATH]
//
// The state is checkpoint_bench's (~100 f32 tensors of mixed sizes, checkpoint_state.hpp),
// each tensor split across the ranks by shard_range: a rank builds and holds only its
// slices. After one unmeasured pass, per round, in turns so none always meets the
// disk's leftovers, each figure from the same barrier to the same barrier, file fsync'd:
//   parallel:     ParallelCheckpoint::save (every rank writes its slices, MPI-IO);
//   parallel_cb:  the same with MPI-IO collective buffering (ParallelOptions);
//   gathered:     the CheckpointActor on rank 0, every rank sending its slices to it;
//   raw:          rank 0 alone write(2)s the whole state's bytes to one file + fsync;
//   raw_parallel: every rank pwrite(2)s its slices at their offsets in one file, fsync.
// Each figure is the median over the rounds.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint_state.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/checkpoint/checkpoint_actor.hpp"
#include "troupe/checkpoint/parallel_checkpoint.hpp"

using namespace troupe;
using namespace troupe::checkpoint;
namespace fs = std::filesystem;
using troupe::bench::Clock;
using troupe::bench::median;
using troupe::bench::seconds_since;

namespace {

void write_all(int fd, const void* data, std::size_t size, off_t at) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd, p, size, at);
    if (n <= 0) {
      std::perror("pwrite");
      std::exit(2);
    }
    p += n, at += n, size -= static_cast<std::size_t>(n);
  }
}

// Seconds from a barrier until every rank has finished `work`.
double timed(const std::function<void()>& work) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = Clock::now();
  work();
  MPI_Barrier(MPI_COMM_WORLD);
  return seconds_since(t0);
}

// Every case, `rounds` times, in turns; rank 0 prints the medians as JSON.
void measure(Runtime& rt, SaveManifest& manifest, const std::vector<Slice>& slices,
             const std::vector<std::int64_t>& offsets, std::size_t bytes, int rounds, const fs::path& dir) {
  const int rank = rt.rank(), world = rt.size();
  ParallelCheckpoint parallel(dir / "parallel", 1, MPI_COMM_WORLD);
  ParallelCheckpoint parallel_cb(dir / "parallel_cb", 1, MPI_COMM_WORLD, ParallelOptions{.collective_buffering = true});
  if (rank == 0)
    rt.spawn_with<CheckpointActor>(0, SpawnOptions{.name = "bench-gathered"}, (dir / "gathered").string(),
                                   std::int64_t{1});
  MPI_Barrier(MPI_COMM_WORLD);
  auto actor = rt.lookup<CheckpointActor>("bench-gathered");

  // The whole state as rank 0's raw baseline writes it (rank 0 only).
  std::vector<float> whole;
  if (rank == 0) {
    whole.resize(bytes / 4);
    for (std::size_t t = 0; t < offsets.size(); ++t) {
      std::size_t n = manifest.tensors[t].shape[0];
      for (std::size_t i = 0; i < n; ++i) whole[static_cast<std::size_t>(offsets[t]) / 4 + i] = static_cast<float>(i);
    }
  }

  std::vector<double> parallel_s, parallel_cb_s, gathered_s, raw_s, raw_parallel_s;
  std::vector<std::function<void()>> cases = {
      // Each save's deletion of the previous checkpoint runs on after it returns: waited
      // for here, untimed, so that it slows no later case.
      [&] {
        parallel_s.push_back(timed([&] { parallel.save(manifest, slices); }));
        parallel.directory().wait_for_removals();
      },
      [&] {
        parallel_cb_s.push_back(timed([&] { parallel_cb.save(manifest, slices); }));
        parallel_cb.directory().wait_for_removals();
      },
      [&] {
        gathered_s.push_back(timed([&] {
          actor.ask(&CheckpointActor::begin, manifest).get();
          std::vector<actors::Future<void>> sent;
          for (std::size_t t = 0; t < slices.size(); ++t)
            if (slices[t].data.numel() > 0)
              sent.push_back(send_piece(actor, manifest.step, static_cast<std::int64_t>(t), slices[t].begin,
                                        slices[t].data, rank));
          for (auto& f : sent) f.get();
          MPI_Barrier(MPI_COMM_WORLD);
          if (rank == 0) actor.ask(&CheckpointActor::commit, manifest.step).get();
        }));
        if (rank == 0) actor.ask(&CheckpointActor::wait_for_removals).get();
      },
      [&] {
        raw_s.push_back(timed([&] {
          if (rank != 0) return;
          int fd = ::open((dir / "raw.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          write_all(fd, whole.data(), bytes, 0);
          ::fsync(fd);
          ::close(fd);
        }));
      },
      [&] {
        raw_parallel_s.push_back(timed([&] {
          fs::path file = dir / "raw_parallel.bin";
          if (rank == 0) ::close(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
          MPI_Barrier(MPI_COMM_WORLD);
          int fd = ::open(file.c_str(), O_WRONLY);
          for (std::size_t t = 0; t < slices.size(); ++t)
            write_all(fd, slices[t].data.raw_data(), slices[t].data.nbytes(), offsets[t] + slices[t].begin * 4);
          ::fsync(fd);
          ::close(fd);
        }));
      }};
  // One unmeasured pass first, so no case pays for creating files or warming the disk.
  for (auto& run_case : cases) run_case();
  for (auto* figures : {&parallel_s, &parallel_cb_s, &gathered_s, &raw_s, &raw_parallel_s}) figures->clear();
  for (int round = 0; round < rounds; ++round) {
    manifest.step = round + 1;
    for (std::size_t c = 0; c < cases.size(); ++c) cases[(c + static_cast<std::size_t>(round)) % cases.size()]();
  }
  if (rank == 0) {
    double mbytes = static_cast<double>(bytes) / 1e6;
    std::cout << "{\"bytes\": " << bytes << ", \"tensors\": " << slices.size() << ", \"ranks\": " << world
              << ", \"rounds\": " << rounds << ", \"parallel_save_MBps\": " << mbytes / median(parallel_s)
              << ", \"parallel_save_collective_buffering_MBps\": " << mbytes / median(parallel_cb_s)
              << ", \"gathered_save_MBps\": " << mbytes / median(gathered_s)
              << ", \"raw_write_fsync_MBps\": " << mbytes / median(raw_s)
              << ", \"raw_parallel_write_fsync_MBps\": " << mbytes / median(raw_parallel_s) << "}" << std::endl;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(argc, argv);
  double mb = 300;
  int rounds = 5;
  fs::path dir = fs::temp_directory_path() / "troupe-ckpt-parallel-bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mb")
      mb = std::stod(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::stoi(argv[i + 1]);
    else if (a == "--dir")
      dir = argv[i + 1];
  }
  const int rank = rt.rank(), world = rt.size();

  // The manifest, this rank's slices (values: the element's index, as checkpoint_bench),
  // and where each tensor's bytes start in the raw files.
  SaveManifest manifest;
  manifest.world_size = world;
  std::vector<Slice> slices;
  std::vector<std::int64_t> offsets;
  std::size_t bytes = 0;
  for (std::int64_t n : troupe::bench::tensor_sizes(mb)) {
    manifest.add_tensor("/model/layers." + std::to_string(offsets.size()) + ".weight", DType::f32, {n});
    auto [b, e] = shard_range(n, rank, world);
    slices.push_back(Slice{b, Tensor::arange(static_cast<double>(b), static_cast<double>(e), 1, DType::f32)});
    offsets.push_back(static_cast<std::int64_t>(bytes));
    bytes += static_cast<std::size_t>(n) * 4;
  }
  if (rank == 0) fs::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  measure(rt, manifest, slices, offsets, bytes, rounds, dir);  // its savers end before MPI does
  rt.shutdown();
  return 0;
}
