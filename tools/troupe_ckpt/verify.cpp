// troupe-ckpt verify: is this checkpoint (or every checkpoint in this folder) whole?
// Opening checks the structure (HDF5, troupe format and version, the complete marker);
// listing the tensors checks every link and every declared size against what the file
// stores; then every dataset is read and its XXH64 recomputed. An invalid file is one
// line on stdout (the verdict) and its reason, one line, on stderr.
#include <filesystem>
#include <iostream>
#include <ostream>

#include "cli.hpp"
#include "json.hpp"
#include "troupe/checkpoint/checkpoint_directory.hpp"
#include "troupe/checkpoint/error.hpp"

namespace troupe::ckpt_tool {

namespace fs = std::filesystem;

namespace {

struct Verdict {
  std::string path;
  bool valid = false;
  std::string error;
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;
};

Verdict verify_file(const std::string& path, const checkpoint::ReadOptions& options) {
  Verdict v;
  v.path = path;
  try {
    checkpoint::FileReader file(path, options);
    for (const auto& t : file.tensors("/")) {
      file.read(t.path, true);
      ++v.tensors;
      v.bytes += t.nbytes();
    }
    v.valid = true;
  } catch (const Error& e) {
    v.error = one_line(e.what());
  }
  return v;
}

std::string encode(const Verdict& v) {
  JsonObject o;
  o.add("file", json_string(v.path)).add("valid", v.valid ? "true" : "false");
  if (v.valid)
    o.add("tensors", json_int(static_cast<std::int64_t>(v.tensors)))
        .add("bytes", json_int(static_cast<std::int64_t>(v.bytes)));
  else
    o.add("error", json_string(v.error));
  return o.str();
}

// The reason a file is invalid, on stderr, whatever stdout carries (text or --json).
void report(const Verdict& v) {
  if (!v.valid) std::cerr << "troupe-ckpt verify: " << v.error << "\n";
}

void print(const Verdict& v, std::ostream& out) {
  if (v.valid)
    out << "ok       " << v.path << "  (" << v.tensors << " tensors, " << human_bytes(v.bytes) << ")\n";
  else
    out << "INVALID  " << v.path << ": " << v.error << "\n";
}

}  // namespace

int cmd_verify(const Args& args, std::ostream& out) {
  TROUPE_CHECK(args.positional.size() == 1, "expects one FILE or DIR, got ", args.positional.size(), " arguments");
  const std::string& target = args.positional[0];
  std::error_code ec;
  if (!fs::exists(target, ec)) TROUPE_THROW(checkpoint::CheckpointError, target, ": no such file or directory");

  if (!fs::is_directory(target, ec)) {
    Verdict v = verify_file(target, read_options(args));
    if (args.json)
      out << encode(v) << "\n";
    else
      print(v, out);
    report(v);
    return v.valid ? kOk : kNo;
  }

  checkpoint::CheckpointDirectory dir(target, 0);
  std::vector<Verdict> verdicts;
  for (const fs::path& p : dir.list()) verdicts.push_back(verify_file(p.string(), read_options(args)));
  std::optional<fs::path> latest = dir.latest_pointer();
  std::vector<std::string> debris;
  for (const auto& e : fs::directory_iterator(target, ec))
    if (const std::string name = e.path().filename().string();
        name.find(".tmp-") != std::string::npos || name.find(".going-") != std::string::npos)
      debris.push_back(e.path().string());
  bool all_valid = !verdicts.empty();
  for (const Verdict& v : verdicts) all_valid = all_valid && v.valid;

  if (args.json) {
    std::vector<std::string> items, junk;
    for (const Verdict& v : verdicts) items.push_back(encode(v));
    for (const std::string& d : debris) junk.push_back(json_string(d));
    out << JsonObject()
               .add("directory", json_string(target))
               .add("checkpoints", json_array(items))
               .add("latest", latest ? json_string(latest->string()) : "null")
               .add("temporary_files", json_array(junk))
               .add("valid", all_valid ? "true" : "false")
               .str()
        << "\n";
  } else {
    for (const Verdict& v : verdicts) print(v, out);
    if (verdicts.empty()) out << "no checkpoints (ckpt-<step>.h5) in " << target << "\n";
    out << "latest -> " << (latest ? latest->filename().string() : std::string("(none)")) << "\n";
    for (const std::string& d : debris)
      out << (d.find(".going-") != std::string::npos ? "old checkpoint being deleted" : "leftover temporary file")
          << " (ignored, removed by the next save): " << d << "\n";
  }
  for (const Verdict& v : verdicts) report(v);
  return all_valid ? kOk : kNo;
}

}  // namespace troupe::ckpt_tool
