// troupe-ckpt ls: the tensors of a checkpoint, in saved order, with the totals.
#include <iomanip>
#include <ostream>

#include "cli.hpp"
#include "json.hpp"

namespace troupe::ckpt_tool {

int cmd_ls(const Args& args, std::ostream& out) {
  TROUPE_CHECK(args.positional.size() == 1, "expects one FILE, got ", args.positional.size(), " arguments");
  checkpoint::FileReader file(args.positional[0], read_options(args));
  std::string group = "/";
  if (auto it = args.options.find("section"); it != args.options.end()) {
    group = "/" + it->second;
    TROUPE_CHECK(file.has_group(group), "no section ", group, " in ", file.path());
  }
  std::vector<checkpoint::TensorInfo> tensors = file.tensors(group);
  std::uint64_t total = 0;
  std::size_t width = 4;
  for (const auto& t : tensors) {
    total += t.nbytes();
    width = std::max(width, t.path.size());
  }
  if (args.json) {
    std::vector<std::string> items;
    for (const auto& t : tensors) {
      std::vector<std::string> dims;
      for (auto d : t.shape) dims.push_back(json_int(d));
      items.push_back(JsonObject()
                          .add("name", json_string(t.path))
                          .add("dtype", json_string(tensor::dtype_name(t.dtype)))
                          .add("shape", json_array(dims))
                          .add("bytes", json_int(static_cast<std::int64_t>(t.nbytes())))
                          .str());
    }
    out << JsonObject()
               .add("file", json_string(file.path()))
               .add("tensors", json_array(items))
               .add("count", json_int(static_cast<std::int64_t>(tensors.size())))
               .add("bytes", json_int(static_cast<std::int64_t>(total)))
               .str()
        << "\n";
    return kOk;
  }
  out << std::left << std::setw(static_cast<int>(width)) << "name"
      << "  " << std::setw(5) << "dtype"
      << "  " << std::setw(16) << "shape"
      << "  "
      << "bytes\n";
  for (const auto& t : tensors)
    out << std::setw(static_cast<int>(width)) << t.path << "  " << std::setw(5) << tensor::dtype_name(t.dtype) << "  "
        << std::setw(16) << shape_string(t.shape) << "  " << human_bytes(t.nbytes()) << "\n";
  out << tensors.size() << " tensors, " << human_bytes(total) << " (" << total << " bytes)\n";
  return kOk;
}

}  // namespace troupe::ckpt_tool
