#include "troupe/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/file_writer.hpp"
#include "troupe/checkpoint/format.hpp"
#include "troupe/checkpoint/snapshot.hpp"

namespace troupe::checkpoint {

namespace fs = std::filesystem;

namespace {

// Passes everything to the file and reports each tensor once it is written.
class ObservingSink final : public Sink {
 public:
  ObservingSink(Sink& file, std::int64_t step, const Checkpoint::WriteObserver& observe)
      : file_(file), step_(step), observe_(observe) {}
  void ensure_group(std::string_view group) override { file_.ensure_group(group); }
  void set_attribute(std::string_view group, std::string_view name, const AttrValue& value) override {
    file_.set_attribute(group, name, value);
  }
  void write_tensor(std::string_view path, const tensor::Tensor& t) override {
    file_.write_tensor(path, t);
    observe_(step_, path);
  }
  tensor::Tensor scratch(const tensor::Shape& shape, tensor::DType dtype) override {
    return file_.scratch(shape, dtype);
  }

 private:
  Sink& file_;
  std::int64_t step_;
  const Checkpoint::WriteObserver& observe_;
};

}  // namespace

namespace {

// A rank's verdict on a candidate file, as the ranks of a sharded resume exchange it
// (VerifyShare::agree passes it through as text): "" when usable, else the reason led
// by one letter that says which kind of failure it is.
constexpr char kDamagedMark = 'D';
constexpr char kStorageMark = 'S';
constexpr char kOtherRunMark = 'O';  // sound, but not this program's (or not allowed): skipped, not set aside

// A sound file that lacks a section this program requires: written by another
// configuration of it, not damaged.
class MissingSection : public FormatError {
 public:
  using FormatError::FormatError;
};

std::string verdict_of(const std::exception& e) {
  const char mark = dynamic_cast<const StorageError*>(&e) ? kStorageMark
                    : dynamic_cast<const MissingSection*>(&e) || dynamic_cast<const FormatNotAllowed*>(&e)
                        ? kOtherRunMark
                        : kDamagedMark;
  return mark + std::string(e.what());
}

}  // namespace

namespace {
// For identities written as "key=value key=value ...": the keys whose values differ,
// "lr 0.05 in the file, 0.1 in this run; ...". nullopt for text of another shape.
std::optional<std::string> key_value_diff(const std::string& recorded, const std::string& ours) {
  const auto parse = [](const std::string& text) -> std::optional<std::vector<std::pair<std::string, std::string>>> {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in(text);
    for (std::string token; in >> token;) {
      const auto eq = token.find('=');
      if (eq == std::string::npos || eq == 0) return std::nullopt;
      out.emplace_back(token.substr(0, eq), token.substr(eq + 1));
    }
    return out;
  };
  const auto a = parse(recorded), b = parse(ours);
  if (!a || !b || a->empty()) return std::nullopt;
  std::string out;
  const auto value_in = [](const auto& list, const std::string& key) -> std::string {
    for (const auto& [k, v] : list)
      if (k == key) return v;
    return "(none)";
  };
  std::vector<std::string> keys;
  for (const auto& [k, v] : *a) keys.push_back(k);
  for (const auto& [k, v] : *b)
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  for (const std::string& key : keys) {
    const std::string mine = value_in(*a, key), theirs = value_in(*b, key);
    if (mine != theirs)
      out += (out.empty() ? "" : "; ") + key + " " + mine + " in the file, " + theirs + " in this run";
  }
  return out;
}
}  // namespace

std::string utc_now_iso8601() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Metadata Metadata::read(const FileReader& file) {
  Attributes root = file.attributes("/");
  Metadata m;
  m.path = file.path();
  try {
    m.format_version = root.get_string(kAttrFormatVersion);
    m.step = root.get_int("step");
    m.epoch = root.get_int("epoch");
    m.world_size = root.get_int("world_size");
    m.created_utc = root.get_string("created_utc");
    m.run_id = root.get_string("run_id");
    m.config_json = root.get_string("config");
  } catch (const FormatError& e) {
    TROUPE_THROW(FormatError, "checkpoint ", file.path(), ": root ", e.what());
  }
  return m;
}

Checkpoint::Checkpoint(fs::path folder, std::size_t keep_last)
    : dir_(std::move(folder), keep_last),
      warn_([](const std::string& message) { std::cerr << "troupe: warning: " << message << "\n"; }) {
  if (const char* retry = std::getenv("TROUPE_STORAGE_RETRY_S"); retry && *retry) {
    char* end = nullptr;
    const double seconds = std::strtod(retry, &end);
    TROUPE_CHECK(end && *end == '\0' && seconds >= 0 && seconds <= 86400, "TROUPE_STORAGE_RETRY_S='", retry,
                 "': expected seconds between 0 and 86400");
    storage_retry_ = std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
  }
}

void Checkpoint::register_state(std::string section, StateSource source) {
  TROUPE_CHECK(!section.empty() && section.find('/') == std::string::npos, "Checkpoint::register_state: section name '",
               section, "' must be a plain group name without '/'");
  for (const Registered& r : sources_)
    TROUPE_CHECK(r.section != section, "Checkpoint::register_state: section '", section, "' is registered twice");
  TROUPE_CHECK(source.save && source.load, "Checkpoint::register_state: section '", section,
               "' needs both a save and a load function");
  sources_.push_back({std::move(section), std::move(source)});
}

Checkpoint::~Checkpoint() { finish_in_flight(); }

void Checkpoint::finish_in_flight() {
  if (in_flight_.valid()) in_flight_.wait();  // its error belongs to its own handle
  if (writer_.joinable()) writer_.join();
  in_flight_ = {};
}

void Checkpoint::write_state(Sink& sink, std::int64_t step, std::int64_t epoch) {
  sink.set_attribute("/", "step", step);
  sink.set_attribute("/", "epoch", epoch);
  sink.set_attribute("/", "world_size", run_.world_size);
  sink.set_attribute("/", "created_utc", utc_now_iso8601());
  sink.set_attribute("/", "run_id", run_.run_id);
  sink.set_attribute("/", "config", run_.config_json);
  for (const auto& [name, value] : run_.attributes) sink.set_attribute("/", name, value);
  for (Registered& r : sources_) {
    SectionWriter section(sink, r.section);
    r.source.save(section);
  }
}

fs::path Checkpoint::write_file(std::int64_t step, const std::function<void(Sink&)>& body) {
  dir_.check_free_space();
  fs::path temp = dir_.temp_path(step);
  try {
    FileWriter file(temp.string());
    if (observe_) {
      ObservingSink observed(file, step, observe_);
      body(observed);
    } else {
      body(file);
    }
    file.close();
  } catch (...) {
    // A failed save must not leave debris that a later listing could trip over.
    std::error_code ec;
    fs::remove(temp, ec);
    throw;
  }
  return dir_.commit(temp, step);
}

fs::path Checkpoint::save(std::int64_t step, std::int64_t epoch) {
  dir_.final_path(step);  // checks the step before any work
  finish_in_flight();
  return write_file(step, [&](Sink& file) { write_state(file, step, epoch); });
}

SaveHandle Checkpoint::save_async(std::int64_t step, std::int64_t epoch, SaveOptions options) {
  dir_.final_path(step);
  if (in_flight_.valid() && options.if_busy == IfBusy::skip &&
      in_flight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return SaveHandle::skipped_save(step);
  finish_in_flight();

  // The only part training waits for: copying the state to host memory.
  auto snapshot = std::make_shared<Snapshot>(std::move(spare_));
  spare_.clear();
  write_state(*snapshot, step, epoch);
  snapshot->finish();

  auto task = std::make_shared<std::packaged_task<fs::path()>>([this, snapshot, step] {
    try {
      fs::path done = write_file(step, [&](Sink& file) { snapshot->replay(file); });
      spare_ = snapshot->release_buffers();
      return done;
    } catch (const std::exception& e) {
      warn_("asynchronous save of step " + std::to_string(step) + " failed: " + e.what());
      throw;
    }
  });
  in_flight_ = task->get_future().share();
  writer_ = std::thread([task] { (*task)(); });
  return SaveHandle(step, in_flight_);
}

Metadata Checkpoint::validate(const FileReader& file) const {
  Metadata meta = Metadata::read(file);
  for (const Registered& r : sources_)
    if (r.source.required && !file.has_group("/" + r.section))
      TROUPE_THROW(MissingSection, "checkpoint ", file.path(), ": no section /", r.section,
                   " (registered as required)");
  if (verify_ == Verify::before_restore) file.verify_share(share_.part, share_.parts);
  return meta;
}

void Checkpoint::check_run_attributes(const FileReader& file) const {
  const Attributes root = file.attributes("/");
  for (const auto& [name, value] : run_.attributes) {
    if (!root.contains(name)) continue;
    const std::string& recorded = root.get_string(name);
    if (recorded == value) continue;
    // Short one-line values are shown; others (a vocabulary) by where they start to differ.
    constexpr std::size_t kShown = 200;
    const auto one_line = [](const std::string& v) {
      return v.size() <= kShown && std::none_of(v.begin(), v.end(), [](char c) { return c == '\n' || c == '\r'; });
    };
    const auto at =
        std::mismatch(recorded.begin(), recorded.end(), value.begin(), value.end()).first - recorded.begin();
    const std::optional<std::string> by_key = key_value_diff(recorded, value);
    const std::string difference =
        by_key ? "differs: " + *by_key
        : one_line(recorded) && one_line(value)
            ? troupe::detail::concat("is '", recorded, "', this run's is '", value, "'")
            : troupe::detail::concat("(", recorded.size(), " bytes) differs from this run's (", value.size(),
                                     " bytes) from byte ", at, " on");
    if (run_.allow_other_run) {
      warn_("checkpoint " + file.path() + " belongs to another run (its root attribute '" + name + "' " + difference +
            "); taking it, as allowed");
      continue;
    }
    TROUPE_THROW(CheckpointError, "checkpoint ", file.path(), " belongs to another run: its root attribute '", name,
                 "' ", difference, "; move it away, use another checkpoint folder, or allow it (nothing was loaded ",
                 "or overwritten)");
  }
}

void Checkpoint::restore(const FileReader& file) {
  for (Registered& r : sources_) {
    if (!file.has_group("/" + r.section)) continue;  // optional and absent
    r.source.load(SectionReader(file, r.section));
  }
}

Metadata Checkpoint::load(const fs::path& path) {
  finish_in_flight();
  FileReader file(path.string(), read_options_);
  Metadata meta;
  std::string unusable;
  try {
    meta = validate(file);
  } catch (const Error& e) {
    if (!share_.agree) throw;
    unusable = e.what();
  }
  if (share_.agree && !(unusable = share_.agree(unusable)).empty()) TROUPE_THROW(FormatError, unusable);
  check_run_attributes(file);
  restore(file);
  return meta;
}

std::optional<Metadata> Checkpoint::load_latest() {
  finish_in_flight();  // the save in flight may be the latest
  for (const fs::path& unfinished : dir_.debris())
    warn_("ignoring unfinished checkpoint " + unfinished.string() +
          " (its writer is gone: a save killed mid-write); the next save removes it");
  // A file that cannot be read now is not damaged: the whole pass is tried again after
  // a pause, up to storage_retry_, and never falls back to an older file (whose resume
  // would silently redo steps and let retention delete the newer one). The pauses are
  // fixed, not measured, so that the ranks of a sharded resume give up together.
  auto pause = std::chrono::milliseconds(100);
  std::chrono::milliseconds waited{0};
  for (;;) {
    std::string unreadable;
    if (std::optional<Metadata> meta = load_pass(unreadable)) return meta;
    if (unreadable.empty()) break;
    if (waited >= storage_retry_)
      TROUPE_THROW(StorageError, "checkpoint: cannot resume from ", dir_.folder().string(), " now: ", unreadable,
                   "; retried for ", waited.count() / 1000.0, " s. Nothing was loaded, skipped or deleted: fix the ",
                   "storage and launch again (resume never starts over while a checkpoint may exist)");
    warn_("cannot read a checkpoint now, retrying in " + std::to_string(pause.count()) + " ms: " + unreadable);
    std::this_thread::sleep_for(pause);
    waited += pause;
    pause = std::min(pause * 2, std::chrono::milliseconds(5000));
  }
  if (dir_.has_history()) {
    std::string aside;
    for (const fs::path& p : dir_.quarantined()) aside += (aside.empty() ? "" : ", ") + p.filename().string();
    TROUPE_THROW(CheckpointError, "checkpoint: ", dir_.folder().string(), " holds no usable checkpoint, but a run ",
                 "saved there", aside.empty() ? std::string() : " (set aside as damaged: " + aside + ")",
                 ". Not starting over from step 0: move the folder away, or ask for a fresh start ",
                 "(Checkpoint::start_fresh, train_digits --fresh), which keeps the old files in a superseded-* folder");
  }
  return std::nullopt;
}

std::optional<Metadata> Checkpoint::load_pass(std::string& unreadable) {
  std::string partly_restored;  // a file whose damage showed after restoring began
  std::vector<fs::path> candidates;
  try {
    candidates = dir_.load_candidates();
  } catch (const StorageError& e) {  // the folder cannot be listed now
    unreadable = e.what();
    return std::nullopt;
  }
  for (const fs::path& candidate : candidates) {
    std::optional<FileReader> file;
    Metadata meta;
    std::string verdict;
    try {
      file.emplace(candidate.string(), read_options_);
      meta = validate(*file);
    } catch (const Error& e) {  // FormatError, StorageError or CheckpointError: not usable now
      verdict = verdict_of(e);
    }
    std::error_code gone;
    if (!verdict.empty() && !share_.agree && !fs::exists(candidate, gone) && !gone)
      continue;                                         // gone: another rank set it aside
    if (share_.agree) verdict = share_.agree(verdict);  // one verdict on every rank
    if (!verdict.empty() && verdict.front() == kStorageMark) {
      unreadable = verdict.substr(1);
      return std::nullopt;
    }
    if (!verdict.empty()) {
      set_aside(candidate, verdict.substr(1), verdict.front() == kDamagedMark);
      continue;
    }
    check_run_attributes(*file);  // another run's file is the user's mistake, not damage: stop
    try {
      restore(*file);
      return meta;
    } catch (const StorageError& e) {
      // A pass that restores again overwrites all of it, so a file that could not be
      // read now is retried like one that failed before restoring -- by a process that
      // resumes alone: ranks of a sharded resume restore apart, and one of them retrying
      // would wait in collectives the others have left.
      if (!share_.agree) {
        unreadable = e.what();
        return std::nullopt;
      }
      TROUPE_THROW(StorageError, e.what(), " (while restoring from it: the state is partly restored and not ",
                   "usable; nothing was deleted)");
    } catch (const FormatError& e) {                 // damage in the data, found while restoring
      if (verify_ == Verify::before_restore) throw;  // verified just now: the program's own load failed
      set_aside(candidate,
                std::string(e.what()) +
                    " (state partly restored from it; the next older checkpoint restores all of it again)",
                true);
      partly_restored = candidate.string();
    }
  }
  if (!partly_restored.empty())
    TROUPE_THROW(CheckpointError, "checkpoint: no valid checkpoint in ", dir_.folder().string(), ", and ",
                 partly_restored, " was partly restored before its damage showed: the state is not usable");
  return std::nullopt;
}

void Checkpoint::set_aside(const fs::path& file, const std::string& why, bool damaged) {
  if (!damaged || !quarantine_) {
    warn_("skipping " + std::string(damaged ? "damaged " : "") + "checkpoint " + file.string() + ": " + why);
    return;
  }
  try {
    const fs::path aside = dir_.quarantine(file);
    warn_("skipping damaged checkpoint " + file.string() + ": " + why + "; set aside as " + aside.filename().string() +
          " (never loaded or counted again)");
  } catch (const Error& e) {
    warn_("skipping damaged checkpoint " + file.string() + ": " + why + "; could not set it aside: " + e.what());
  }
}

fs::path Checkpoint::start_fresh() {
  finish_in_flight();
  const fs::path aside = dir_.supersede();
  if (!aside.empty())
    warn_("starting fresh as asked: the earlier checkpoints of " + dir_.folder().string() + " are kept in " +
          aside.string());
  return aside;
}

}  // namespace troupe::checkpoint
