// Checkpoint save and load bandwidth against the disk itself, in one process so both see
// the same page cache and disk state. Prints one JSON object (bench/run pairs it with
// bench/checkpoint_baselines.py: h5py and torch.save on the same tensor sizes).
//
//   checkpoint_bench [--mb 300] [--rounds 5] [--dir PATH] [--keep 1]
// --keep 1 leaves the folder and its last checkpoint (bench/run times troupe-ckpt on it).
//
// The state is ~100 f32 tensors of mixed sizes (tensor_sizes below, also in the Python
// script). Each figure is the median of the rounds:
//   save: Checkpoint::save (HDF5 write, fsync, rename, fsync dir, latest) vs write(2) of
//         the same bytes + fsync, to one file rewritten each round and to a new file
//         each round with the previous one kept (as the checkpoint's keep_last = 1);
//   load: Checkpoint::load_latest (checksums verified, and once without) from a cold
//         cache vs read(2) of the raw file, cold. "Cold" = posix_fadvise(DONTNEED) after
//         fsync, which drops the file's clean pages without root;
//   async: the stall of save_async (snapshot into recycled buffers) vs a synchronous save;
//   memory: the saving process's peak RSS growth during a save (VmHWM after clear_refs).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint_state.hpp"
#include "troupe/checkpoint/checkpoint.hpp"

using namespace troupe;
using namespace troupe::checkpoint;
namespace fs = std::filesystem;
using troupe::bench::Clock;
using troupe::bench::median;
using troupe::bench::seconds_since;
using troupe::bench::tensor_sizes;

namespace {

void drop_cache(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double raw_write_fsync(const fs::path& file, const std::vector<Tensor>& tensors) {
  auto t0 = Clock::now();
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (const Tensor& t : tensors) {
    const char* p = static_cast<const char*>(t.raw_data());
    std::size_t left = t.nbytes();
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n <= 0) {
        std::perror("write");
        std::exit(2);
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  ::fsync(fd);
  ::close(fd);
  return seconds_since(t0);
}

double raw_read(const fs::path& file, std::size_t bytes) {
  std::vector<char> buffer(bytes);
  auto t0 = Clock::now();
  int fd = ::open(file.c_str(), O_RDONLY);
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::read(fd, buffer.data() + done, bytes - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return seconds_since(t0);
}

std::int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size()));
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 300;
  int rounds = 5;
  bool keep = false;
  fs::path dir = fs::temp_directory_path() / ("troupe-ckpt-bench-" + std::to_string(::getpid()));
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mb")
      mb = std::stod(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::stoi(argv[i + 1]);
    else if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--keep")
      keep = std::string(argv[i + 1]) == "1";
  }
  fs::create_directories(dir);

  std::vector<Tensor> state;
  std::size_t bytes = 0, largest = 0;
  for (std::int64_t n : tensor_sizes(mb)) {
    state.push_back(Tensor::arange(0, static_cast<double>(n), 1, DType::f32));
    bytes += state.back().nbytes();
    largest = std::max(largest, state.back().nbytes());
  }
  Checkpoint ckpt(dir / "ckpt", 1);
  ckpt.register_state("model", {.save =
                                    [&](SectionWriter& w) {
                                      for (std::size_t i = 0; i < state.size(); ++i)
                                        w.tensor("layers." + std::to_string(i) + ".weight", state[i]);
                                    },
                                // Into the live tensors, as a model's load_state_dict would.
                                .load =
                                    [&](const SectionReader& r) {
                                      for (std::size_t i = 0; i < state.size(); ++i)
                                        r.read_into("layers." + std::to_string(i) + ".weight", state[i]);
                                    }});

  std::vector<double> save_s, raw_w_s, raw_new_s, load_s, load_nv_s, load_wr_s, raw_r_s, sync_s, stall_s;
  std::int64_t peak_extra_kib = 0;
  for (int round = 0; round < rounds; ++round) {
    // Take turns at going first, so neither always meets the disk's leftovers.
    auto do_raw = [&] {
      raw_w_s.push_back(raw_write_fsync(dir / "raw.bin", state));
      // A new file each round, the previous one kept until this one is durable: what a
      // crash-safe save must do (it cannot overwrite the checkpoint it may fall back
      // to), and on this VM slower than rewriting one file, whose freed pages the
      // kernel hands straight back.
      raw_new_s.push_back(raw_write_fsync(dir / ("raw-" + std::to_string(round) + ".bin"), state));
      std::error_code ec;
      fs::remove(dir / ("raw-" + std::to_string(round - 1) + ".bin"), ec);
    };
    auto do_save = [&] {
      { std::ofstream("/proc/self/clear_refs") << "5"; }
      std::int64_t before = status_kib("VmRSS:");
      auto t0 = Clock::now();
      ckpt.save(10 * round + 1);
      save_s.push_back(seconds_since(t0));
      // The previous checkpoint's deletion runs on after save() returns, as the raw
      // baseline's removal runs outside its timing; neither may slow the next figure.
      ckpt.directory().wait_for_removals();
      peak_extra_kib = std::max(peak_extra_kib, status_kib("VmHWM:") - before);
    };
    if (round % 2) {
      do_raw();
      do_save();
    } else {
      do_save();
      do_raw();
    }

    fs::path file = ckpt.directory().final_path(10 * round + 1);
    drop_cache(dir / "raw.bin");
    raw_r_s.push_back(raw_read(dir / "raw.bin", bytes));
    drop_cache(file);
    auto t0 = Clock::now();
    ckpt.load_latest();
    load_s.push_back(seconds_since(t0));
    drop_cache(file);
    // Without verification: read every dataset once into the same live tensors.
    t0 = Clock::now();
    {
      FileReader reader(file.string());
      for (std::size_t i = 0; i < state.size(); ++i)
        reader.read_into("/model/layers." + std::to_string(i) + ".weight", state[i], false);
    }
    load_nv_s.push_back(seconds_since(t0));
    // Verified while restoring: one read.
    drop_cache(file);
    ckpt.set_verify(Verify::while_restoring);
    t0 = Clock::now();
    ckpt.load_latest();
    load_wr_s.push_back(seconds_since(t0));
    ckpt.set_verify(Verify::before_restore);

    // Async: the stall, after one save to warm the recycled snapshot buffers.
    ckpt.save_async(10 * round + 2).get();
    ckpt.directory().wait_for_removals();
    t0 = Clock::now();
    SaveHandle h = ckpt.save_async(10 * round + 3);
    stall_s.push_back(seconds_since(t0));
    h.get();
    ckpt.directory().wait_for_removals();
    t0 = Clock::now();
    ckpt.save(10 * round + 4);
    sync_s.push_back(seconds_since(t0));
    ckpt.directory().wait_for_removals();
  }
  double mbytes = static_cast<double>(bytes) / 1e6;
  std::cout << "{\"bytes\": " << bytes << ", \"tensors\": " << state.size() << ", \"largest_bytes\": " << largest
            << ", \"rounds\": " << rounds << ", \"troupe_save_MBps\": " << mbytes / median(save_s)
            << ", \"raw_write_fsync_MBps\": " << mbytes / median(raw_w_s)
            << ", \"raw_write_fsync_new_file_MBps\": " << mbytes / median(raw_new_s)
            << ", \"troupe_load_cold_MBps\": " << mbytes / median(load_s)
            << ", \"troupe_load_noverify_cold_MBps\": " << mbytes / median(load_nv_s)
            << ", \"troupe_load_while_restoring_cold_MBps\": " << mbytes / median(load_wr_s)
            << ", \"raw_read_cold_MBps\": " << mbytes / median(raw_r_s)
            << ", \"async_stall_ms\": " << 1e3 * median(stall_s) << ", \"sync_save_ms\": " << 1e3 * median(sync_s)
            << ", \"peak_extra_MB\": " << static_cast<double>(peak_extra_kib) * 1024 / 1e6 << "}\n";
  std::error_code ec;
  if (!keep) fs::remove_all(dir, ec);
  return 0;
}
