#include "cli.hpp"

#include <cstdio>

#include "troupe/error.hpp"

namespace troupe::ckpt_tool {

Args parse_args(int argc, char** argv, const std::vector<std::string>& valued) {
  Args args;
  args.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      args.json = true;
    } else if (a == "--help" || a == "-h") {
      args.help = true;
    } else if (a == "--allow-format-1") {
      args.allow_format_1 = true;
    } else if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string key = a.substr(2), value;
      auto eq = key.find('=');
      if (eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
      }
      bool known = false;
      for (const std::string& v : valued) known = known || v == key;
      TROUPE_CHECK(known, "unknown option --", key, " for '", args.command, "'");
      if (eq == std::string::npos) {
        TROUPE_CHECK(i + 1 < argc, "option --", key, " needs a value");
        value = argv[++i];
      }
      args.options[key] = value;
    } else {
      args.positional.push_back(a);
    }
  }
  return args;
}

checkpoint::ReadOptions read_options(const Args& args) { return {.allow_format_1 = args.allow_format_1}; }

std::string one_line(std::string_view message) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b != 0x7f) {
      out += c;
    } else {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0xf];
    }
  }
  return out;
}

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string shape_string(const tensor::Shape& shape) { return tensor::to_string(shape); }

std::string resolve_tensor(const checkpoint::FileReader& file, const std::string& name) {
  std::vector<checkpoint::TensorInfo> all = file.tensors("/");
  std::vector<std::string> hits;
  for (const auto& t : all) {
    if (t.path == name || t.path == "/model/" + name) return t.path;
    if (t.path.size() > name.size() && t.path.compare(t.path.size() - name.size(), name.size(), name) == 0 &&
        t.path[t.path.size() - name.size() - 1] == '/')
      hits.push_back(t.path);
  }
  if (hits.size() == 1) return hits[0];
  std::string listed;
  for (std::size_t i = 0; i < hits.size() && i < 5; ++i) listed += (i ? ", " : "") + hits[i];
  if (hits.empty())
    TROUPE_THROW(InvalidArgument, "no tensor '", name, "' in ", file.path(), " (", all.size(),
                 " tensors; see troupe-ckpt ls)");
  TROUPE_THROW(InvalidArgument, "tensor name '", name, "' is ambiguous in ", file.path(), ": ", listed);
}

}  // namespace troupe::ckpt_tool
