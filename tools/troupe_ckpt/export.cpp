// troupe-ckpt export: one section of a checkpoint as a .safetensors file.
//
// The safetensors layout: 8 bytes little-endian N, then N bytes of JSON
//   {"__metadata__": {...}, "name": {"dtype": "F32", "shape": [3, 4], "data_offsets": [b, e]}}
// padded with spaces to a multiple of 8, then the tensors' raw little-endian bytes back to
// back, offsets relative to the end of the header. Tensors are streamed one at a time
// (read, checksum verified, appended), so memory stays at the largest tensor.
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "cli.hpp"
#include "json.hpp"
#include "troupe/checkpoint/error.hpp"

namespace troupe::ckpt_tool {

namespace {
const char* safetensors_dtype(tensor::DType t) {
  switch (t) {
    case tensor::DType::f32: return "F32";
    case tensor::DType::f64: return "F64";
    case tensor::DType::f16: return "F16";
    case tensor::DType::bf16: return "BF16";
    case tensor::DType::i32: return "I32";
    case tensor::DType::i64: return "I64";
    case tensor::DType::u8: return "U8";
  }
  return "?";
}
}  // namespace

int cmd_export(const Args& args, std::ostream& out) {
  TROUPE_CHECK(args.positional.size() == 1, "expects one FILE, got ", args.positional.size(), " arguments");
  auto to = args.options.find("to");
  TROUPE_CHECK(to != args.options.end() && !to->second.empty(), "needs --to OUT.safetensors");
  std::string section = "model";
  if (auto it = args.options.find("section"); it != args.options.end()) section = it->second;

  checkpoint::FileReader file(args.positional[0], read_options(args));
  std::string group = "/" + section;
  TROUPE_CHECK(file.has_group(group), "no section ", group, " in ", file.path());
  std::vector<checkpoint::TensorInfo> tensors = file.tensors(group);

  JsonObject header;
  const checkpoint::Attributes root = file.attributes("/");
  JsonObject meta;
  meta.add("format", json_string("pt")).add("source", json_string("troupe-checkpoint " + group));
  if (const auto* step = root.find("step")) meta.add("step", json_string(checkpoint::to_string(*step)));
  header.add("__metadata__", meta.str());
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    std::vector<std::string> dims;
    for (auto d : t.shape) dims.push_back(json_int(d));
    std::uint64_t end = offset + t.nbytes();
    header.add(t.path.substr(group.size() + 1),
               JsonObject()
                   .add("dtype", json_string(safetensors_dtype(t.dtype)))
                   .add("shape", json_array(dims))
                   .add("data_offsets", json_array({json_int(static_cast<std::int64_t>(offset)),
                                                    json_int(static_cast<std::int64_t>(end))}))
                   .str());
    offset = end;
  }
  std::string json = header.str();
  json.append((8 - json.size() % 8) % 8, ' ');

  // Written beside the target and renamed, so a failed export leaves no half file.
  std::filesystem::path target = to->second;
  std::filesystem::path temp = target;
  temp += ".tmp-" + std::to_string(::getpid());
  try {
    std::ofstream f(temp, std::ios::binary | std::ios::trunc);
    if (!f) TROUPE_THROW(checkpoint::CheckpointError, "cannot create ", temp.string());
    std::uint64_t n = json.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(json.data(), static_cast<std::streamsize>(json.size()));
    for (const auto& t : tensors) {
      tensor::Tensor data = file.read(t.path);
      f.write(static_cast<const char*>(data.raw_data()), static_cast<std::streamsize>(data.nbytes()));
    }
    f.close();
    if (!f) TROUPE_THROW(checkpoint::CheckpointError, "cannot write ", temp.string());
    std::filesystem::rename(temp, target);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(temp, ec);
    throw;
  }
  if (args.json) {
    out << JsonObject()
               .add("file", json_string(file.path()))
               .add("output", json_string(target.string()))
               .add("tensors", json_int(static_cast<std::int64_t>(tensors.size())))
               .add("bytes", json_int(static_cast<std::int64_t>(offset)))
               .str()
        << "\n";
  } else {
    out << "wrote " << tensors.size() << " tensors of " << group << " (" << human_bytes(offset) << ") to "
        << target.string() << "\n";
  }
  return kOk;
}

}  // namespace troupe::ckpt_tool
