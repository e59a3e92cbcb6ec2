#include "troupe/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <iostream>

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
      warn_([](const std::string& message) { std::cerr << "troupe: warning: " << message << "\n"; }) {}

void Checkpoint::register_state(std::string section, StateSource source) {
  TROUPE_CHECK(!section.empty() && section.find('/') == std::string::npos,
               "Checkpoint::register_state: section name '", section,
               "' must be a plain group name without '/'");
  for (const Registered& r : sources_)
    TROUPE_CHECK(r.section != section, "Checkpoint::register_state: section '", section,
                 "' is registered twice");
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
      TROUPE_THROW(FormatError, "checkpoint ", file.path(), ": no section /", r.section,
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
    const auto at = std::mismatch(recorded.begin(), recorded.end(), value.begin(), value.end()).first - recorded.begin();
    const std::string difference =
        one_line(recorded) && one_line(value)
            ? troupe::detail::concat("is '", recorded, "', this run's is '", value, "'")
            : troupe::detail::concat("(", recorded.size(), " bytes) differs from this run's (", value.size(),
                             " bytes) from byte ", at, " on");
    TROUPE_THROW(CheckpointError, "checkpoint ", file.path(), " belongs to another run: its root attribute '", name,
                 "' ", difference, "; move it away or use another checkpoint folder (nothing was loaded or ",
                 "overwritten)");
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
  FileReader file(path.string());
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
  std::string partly_restored;  // a file whose damage showed after restoring began
  for (const fs::path& candidate : dir_.load_candidates()) {
    std::optional<FileReader> file;
    Metadata meta;
    std::string unusable;
    try {
      file.emplace(candidate.string());
      meta = validate(*file);
    } catch (const Error& e) {  // FormatError or CheckpointError: this file is unusable
      unusable = e.what();
    }
    if (share_.agree) unusable = share_.agree(unusable);  // one verdict on every rank
    if (!unusable.empty()) {
      warn_("skipping checkpoint " + candidate.string() + ": " + unusable);
      continue;
    }
    check_run_attributes(*file);  // another run's file is the user's mistake, not damage: stop
    if (verify_ == Verify::before_restore) {
      restore(*file);
      return meta;
    }
    try {
      restore(*file);
      return meta;
    } catch (const FormatError& e) {  // damage in the data, found while restoring
      warn_("skipping checkpoint " + candidate.string() + ": " + e.what() +
            " (state partly restored from it; the next older checkpoint restores all of it again)");
      partly_restored = candidate.string();
    }
  }
  if (!partly_restored.empty())
    TROUPE_THROW(CheckpointError, "checkpoint: no valid checkpoint in ", dir_.folder().string(), ", and ",
                 partly_restored, " was partly restored before its damage showed: the state is not usable");
  return std::nullopt;
}

}  // namespace troupe::checkpoint
