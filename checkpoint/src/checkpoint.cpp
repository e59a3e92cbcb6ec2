#include "troupe/checkpoint/checkpoint.hpp"

#include <ctime>
#include <filesystem>
#include <iostream>

#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/format.hpp"

namespace troupe::checkpoint {

namespace fs = std::filesystem;

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

fs::path Checkpoint::save(std::int64_t step, std::int64_t epoch) {
  fs::path final = dir_.final_path(step);  // checks the step before any work
  fs::path temp = dir_.temp_path(step);
  try {
    FileWriter file(temp.string());
    file.set_attribute("/", "step", step);
    file.set_attribute("/", "epoch", epoch);
    file.set_attribute("/", "world_size", run_.world_size);
    file.set_attribute("/", "created_utc", utc_now_iso8601());
    file.set_attribute("/", "run_id", run_.run_id);
    file.set_attribute("/", "config", run_.config_json);
    for (Registered& r : sources_) {
      SectionWriter section(file, r.section);
      r.source.save(section);
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

Metadata Checkpoint::validate(const FileReader& file) const {
  Metadata meta = Metadata::read(file);
  for (const Registered& r : sources_)
    if (r.source.required && !file.has_group("/" + r.section))
      TROUPE_THROW(FormatError, "checkpoint ", file.path(), ": no section /", r.section,
                   " (registered as required)");
  file.verify_all();
  return meta;
}

Metadata Checkpoint::load(const fs::path& path) {
  FileReader file(path.string());
  Metadata meta = validate(file);
  for (Registered& r : sources_) {
    if (!file.has_group("/" + r.section)) continue;  // optional and absent
    r.source.load(SectionReader(file, r.section));
  }
  return meta;
}

std::optional<Metadata> Checkpoint::load_latest() {
  for (const fs::path& candidate : dir_.load_candidates()) {
    std::optional<FileReader> file;
    Metadata meta;
    try {
      file.emplace(candidate.string());
      meta = validate(*file);
    } catch (const Error& e) {  // FormatError or CheckpointError: this file is unusable
      warn_("skipping checkpoint " + candidate.string() + ": " + e.what());
      continue;
    }
    for (Registered& r : sources_) {
      if (!file->has_group("/" + r.section)) continue;
      r.source.load(SectionReader(*file, r.section));
    }
    return meta;
  }
  return std::nullopt;
}

}  // namespace troupe::checkpoint
