// Checkpoint: save and restore a training run's state in a folder of HDF5 files.
//
//   checkpoint::Checkpoint ckpt("runs/ckpt", /*keep_last=*/3);
//   ckpt.set_run_info({.run_id = "digits-1", .config_json = cfg, .world_size = 2});
//   ckpt.register_state("model", {
//       .save = [&](SectionWriter& w) { write_state_dict(w, model.state_dict()); },
//       .load = [&](const SectionReader& r) {
//         model.load_state_dict(read_state_dict<nn::StateDict>(r)); }});
//   ckpt.register_state("sampler", {.save = [&](SectionWriter& w) {
//                                     w.attribute("epoch", epoch); ... }, ...});
//   ckpt.save(step, epoch);                       // durable when it returns
//   if (auto meta = ckpt.load_latest()) resume_at(meta->step);
//
// save() writes the root metadata, then each registered section in registration order,
// streaming tensor by tensor (see section.hpp), into a temporary file that
// CheckpointDirectory commits crash-safely. It is synchronous and runs on the caller's
// thread; the checkpoint actor (async saves) builds on the same pieces.
//
// load_latest() tries the newest checkpoint first. A file is used only if it opens, is a
// troupe checkpoint, is complete, every dataset's checksum verifies and every required
// section is present; otherwise it is skipped with a warning naming it and the reason,
// and the next older one is tried. Only then are the sections' load functions called, so
// a bad file never leaves state half restored. An exception thrown by a load function
// itself (a model whose shapes differ) is the program's error and propagates.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "troupe/checkpoint/checkpoint_directory.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/section.hpp"

namespace troupe::checkpoint {

// Who wrote the checkpoint and with what settings: copied to the root attributes.
struct RunInfo {
  std::string run_id;
  std::string config_json = "{}";  // the run's configuration, as JSON text
  std::int64_t world_size = 1;
};

// The root attributes of a checkpoint file.
struct Metadata {
  std::filesystem::path path;
  std::string format_version;
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t world_size = 1;
  std::string created_utc;  // ISO 8601, "2026-11-23T11:40:00Z"
  std::string run_id;
  std::string config_json;

  // Throws FormatError naming the file and the attribute that is missing or mistyped.
  static Metadata read(const FileReader& file);
};

class Checkpoint {
 public:
  using WarningHandler = std::function<void(const std::string&)>;

  explicit Checkpoint(std::filesystem::path folder, std::size_t keep_last = 3);

  void set_run_info(RunInfo info) { run_ = std::move(info); }
  // Where skip warnings go; by default, a line on stderr.
  void set_warning_handler(WarningHandler handler) { warn_ = std::move(handler); }
  // `section` is a plain name ("model", "optimizer", "scaler", "sampler", "rng", "status",
  // "best", ...): no '/', not registered twice.
  void register_state(std::string section, StateSource source);

  // Writes a checkpoint of every registered section; returns its path once durable.
  std::filesystem::path save(std::int64_t step, std::int64_t epoch = 0);
  // Restores from the newest valid checkpoint; nullopt when there is none (a fresh run).
  std::optional<Metadata> load_latest();
  // Restores from one file; throws FormatError/CheckpointError if it is not usable.
  Metadata load(const std::filesystem::path& file);

  const CheckpointDirectory& directory() const { return dir_; }

 private:
  struct Registered {
    std::string section;
    StateSource source;
  };
  // Checks a file fully (see above) and returns its metadata; throws when unusable.
  Metadata validate(const FileReader& file) const;

  CheckpointDirectory dir_;
  RunInfo run_;
  WarningHandler warn_;
  std::vector<Registered> sources_;
};

// "2026-11-23T11:40:00Z" for now.
std::string utc_now_iso8601();

}  // namespace troupe::checkpoint
