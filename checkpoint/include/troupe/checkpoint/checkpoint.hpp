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
// CheckpointDirectory commits crash-safely, all on the caller's thread.
//
// save_async() only snapshots: it runs every section's save into host memory (Snapshot)
// on the caller's thread and returns; a writer thread owned by this object then writes
// and commits the file while training goes on. One save is written at a time: a save
// (either kind) that starts while another is writing waits for it, or with
// SaveOptions{.if_busy = IfBusy::skip} an async one is skipped. Destroying the
// Checkpoint, load() and load_latest() wait for the save in flight. Between async saves
// the Checkpoint keeps the last snapshot's host buffers to copy the next one into. The warning handler may be called
// from the writer thread (a failed async save is reported there as well as through its handle).
//
// load_latest() first warns of debris (temporary files of saves killed mid-write, which
// are never read), then tries the newest checkpoint first. A file is used only if it opens, is a
// troupe checkpoint, is complete, every dataset's checksum verifies and every required
// section is present. A damaged one is set aside (renamed *.damaged, with a warning
// naming it and the reason) and the next older one is tried. A file that cannot be read
// now (StorageError: EIO, EACCES, ESTALE, a lock...) is not damaged: the pass is retried
// with backoff, then load_latest fails with the errno and path; it never takes an older
// file or starts over because of one. Only then are the sections' load functions called, so
// a bad file never leaves state half restored. The verifying pass reads each dataset
// into one reused buffer (memory: the largest tensor), which also brings the file into
// the page cache; load functions then read from it -- best with SectionReader::read_into
// straight into the live parameters, so a load allocates nothing either. An exception thrown by a load function
// itself (a model whose shapes differ) is the program's error and propagates.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "troupe/checkpoint/checkpoint_directory.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/save_handle.hpp"
#include "troupe/checkpoint/section.hpp"

namespace troupe::checkpoint {

// Who wrote the checkpoint and with what settings: copied to the root attributes.
struct RunInfo {
  std::string run_id;
  std::string config_json = "{}";  // the run's configuration, as JSON text
  std::int64_t world_size = 1;
  // More string attributes of the root, each naming what the run's data or model is
  // (a tokenizer's vocabulary). A checkpoint that records one of them with another
  // value belongs to another run: loading it is a CheckpointError, not a skip.
  std::vector<std::pair<std::string, std::string>> attributes{};
  // Take such a checkpoint anyway, with a warning saying what differs.
  bool allow_other_run = false;
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

enum class IfBusy { wait, skip };

// When load_latest checks the checksums. before_restore (the default) reads the whole
// file once to verify it, then restores from it: a bad file is skipped before any state
// changes, at the cost of a second, page-cached read. while_restoring verifies each
// tensor as the load functions read it -- one read -- and when damage shows half way it
// warns and restores everything again from the next older file; if none is left,
// load_latest throws CheckpointError (the state was partly overwritten) instead of
// returning nothing.
enum class Verify { before_restore, while_restoring };
struct SaveOptions {
  // What save_async does while the previous save is still writing: wait for it (the
  // default: no checkpoint is lost) or return at once with a skipped handle (training
  // never stalls on the disk; the next save will catch up).
  IfBusy if_busy = IfBusy::wait;
};

// A load that several ranks make together, each restoring its own slices of one file
// (a sharded resume): each rank verifies checksum share `part` of `parts`
// (FileReader::verify_share), and `agree` -- a collective every rank calls once per
// candidate file with its verdict ("" or why the file is unusable here) -- returns the
// first non-empty verdict of any rank, so that all ranks skip or use the same file.
struct VerifyShare {
  int part = 0;
  int parts = 1;
  std::function<std::string(const std::string& verdict)> agree;
};

class Checkpoint {
 public:
  using WarningHandler = std::function<void(const std::string&)>;
  // Called on the writing thread after each tensor of the checkpoint of `step` is in its
  // temporary file, before the commit: for progress reports, and for fault injection
  // (TROUPE_FAULT kind=crash_in_save kills the process here, mid-write).
  using WriteObserver = std::function<void(std::int64_t step, std::string_view tensor)>;

  explicit Checkpoint(std::filesystem::path folder, std::size_t keep_last = 3);
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  ~Checkpoint();

  void set_run_info(RunInfo info) { run_ = std::move(info); }
  // Where skip warnings go; by default, a line on stderr.
  void set_warning_handler(WarningHandler handler) { warn_ = std::move(handler); }
  void set_verify(Verify verify) { verify_ = verify; }
  // See VerifyShare (with Verify::before_restore).
  void set_verify_share(VerifyShare share) { share_ = std::move(share); }
  // Set it before saving: the writer thread reads it without a lock.
  void set_write_observer(WriteObserver observer) { observe_ = std::move(observer); }
  // `section` is a plain name ("model", "optimizer", "scaler", "sampler", "rng", "status",
  // "best", ...): no '/', not registered twice.
  void register_state(std::string section, StateSource source);

  // Writes a checkpoint of every registered section; returns its path once durable.
  std::filesystem::path save(std::int64_t step, std::int64_t epoch = 0);
  // Snapshots every section to host memory and writes it on a background thread.
  SaveHandle save_async(std::int64_t step, std::int64_t epoch = 0, SaveOptions options = {});
  // Restores from the newest valid checkpoint; nullopt when the folder shows no run at
  // all (a fresh run). Throws StorageError when a file cannot be read for
  // storage_retry(), and CheckpointError when the folder holds checkpoints (or a
  // `latest`, or files set aside) but none is usable: it never silently starts over.
  std::optional<Metadata> load_latest();
  // For a run asked to start over in a used folder: moves the earlier files aside
  // (CheckpointDirectory::supersede) and returns where, so that load_latest() finds none.
  std::filesystem::path start_fresh();
  // How long load_latest() retries a file it cannot read now (StorageError); 30 s, or
  // TROUPE_STORAGE_RETRY_S when set.
  void set_storage_retry(std::chrono::milliseconds retry) { storage_retry_ = retry; }
  std::chrono::milliseconds storage_retry() const { return storage_retry_; }
  // How load() and load_latest() open files (ReadOptions: format 1 only when asked).
  // A file refused by them is skipped, not set aside as damaged.
  void set_read_options(ReadOptions options) { read_options_ = options; }
  // Whether load_latest() renames a damaged file to *.damaged (the default) or only
  // skips it: of the processes that resume from one folder, one should set it aside.
  void set_quarantine(bool quarantine) { quarantine_ = quarantine; }
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
  // Throws CheckpointError when the file records a RunInfo attribute with another value.
  void check_run_attributes(const FileReader& file) const;
  void restore(const FileReader& file);
  // One pass over the candidates: the metadata of the file restored, or nullopt with
  // `unreadable` set when a file could not be read now (the pass stops there).
  std::optional<Metadata> load_pass(std::string& unreadable);
  // Skips a file with a warning; a damaged one is also quarantined when asked to.
  void set_aside(const std::filesystem::path& file, const std::string& why, bool damaged);
  // Root attributes, then every section, into `sink`.
  void write_state(Sink& sink, std::int64_t step, std::int64_t epoch);
  // Writes `body` into the temporary file of `step` and commits it.
  std::filesystem::path write_file(std::int64_t step, const std::function<void(Sink&)>& body);
  // Waits for the async save in flight, if any, and joins its thread.
  void finish_in_flight();

  CheckpointDirectory dir_;
  RunInfo run_;
  WarningHandler warn_;
  Verify verify_ = Verify::before_restore;
  VerifyShare share_;
  WriteObserver observe_;
  std::vector<Registered> sources_;
  std::chrono::milliseconds storage_retry_{30'000};
  bool quarantine_ = true;
  ReadOptions read_options_;
  std::shared_future<std::filesystem::path> in_flight_;
  std::thread writer_;
  // Host buffers of the last async snapshot, reused by the next (see snapshot.hpp).
  // Touched by the writer thread only before in_flight_ is ready, by the caller only
  // after: finish_in_flight() orders the two.
  std::vector<tensor::Tensor> spare_;
};

// "2026-11-23T11:40:00Z" for now.
std::string utc_now_iso8601();

}  // namespace troupe::checkpoint
