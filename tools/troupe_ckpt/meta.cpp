// troupe-ckpt meta: the root attributes, then every group's attributes (sampler position,
// status counters, optimizer hyper-parameters), which is the small state of a run.
#include <ostream>

#include "cli.hpp"
#include "json.hpp"

namespace troupe::ckpt_tool {

namespace {

std::string encode(const checkpoint::AttrValue& v) {
  if (const auto* i = std::get_if<std::int64_t>(&v)) return json_int(*i);
  if (const auto* d = std::get_if<double>(&v)) return json_number(*d);
  return json_string(std::get<std::string>(v));
}

// Every group below the root that has attributes, depth first in creation order.
void collect(const checkpoint::FileReader& file, std::vector<std::pair<std::string, checkpoint::Attributes>>& out) {
  for (const std::string& path : file.groups("/")) {
    checkpoint::Attributes attrs = file.attributes(path);
    if (!attrs.empty()) out.emplace_back(path, std::move(attrs));
  }
}

}  // namespace

int cmd_meta(const Args& args, std::ostream& out) {
  TROUPE_CHECK(args.positional.size() == 1, "expects one FILE, got ", args.positional.size(), " arguments");
  checkpoint::FileReader file(args.positional[0], read_options(args));
  std::vector<std::pair<std::string, checkpoint::Attributes>> groups;
  groups.emplace_back("/", file.attributes("/"));
  collect(file, groups);

  if (args.json) {
    JsonObject all;
    for (const auto& [path, attrs] : groups) {
      JsonObject o;
      for (const auto& [k, v] : attrs) o.add(k, encode(v));
      all.add(path, o.str());
    }
    out << JsonObject().add("file", json_string(file.path())).add("groups", all.str()).str() << "\n";
    return kOk;
  }
  for (const auto& [path, attrs] : groups) {
    out << path << "\n";
    for (const auto& [k, v] : attrs) {
      // Strings unquoted for people; the config is JSON already.
      const auto* s = std::get_if<std::string>(&v);
      out << "  " << k << " = " << (s ? *s : checkpoint::to_string(v)) << "\n";
    }
  }
  return kOk;
}

}  // namespace troupe::ckpt_tool
