// Fuzz target: checkpoint files of arbitrary *structure*. checkpoint_file mutates bytes,
// which mostly breaks HDF5's checksums and stops at the first one; here the input is a
// program that builds a well-formed HDF5 file through the C API -- groups, hard links
// (cycles, shared objects), soft and external links, datasets of any rank, dims up to
// 2^63, many types, contiguous/compact/chunked/external/virtual storage, filters,
// attributes of any type and name -- which is then read as troupe-ckpt verify reads it:
// FileReader, every group's attributes, tensors(), each tensor read, verify_all().
//
// It must end in success or a troupe::Error: never a crash, a hang (external links and
// external storage name a FIFO, which blocks whoever opens it), or an allocation beyond
// what the file can back (checked below: no listed tensor larger than 1032x the file,
// deflate's best ratio; libFuzzer's -malloc_limit_mb catches the rest). To see what an
// input builds: TROUPE_FUZZ_KEEP=copy.h5 fuzz_checkpoint_structure_replay INPUT.
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/xxhash64.hpp"
#include "troupe/error.hpp"

namespace {

// The fuzz input, read a byte or a choice at a time; zeros once it runs out.
class Program {
 public:
  Program(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::size_t pick(std::size_t n) { return n == 0 ? 0 : byte() % n; }
  bool flag() { return byte() & 1; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

// Closes the HDF5 ids the builder made (of any kind: H5Idec_ref), whatever failed.
class Ids {
 public:
  ~Ids() { close(); }
  hid_t keep(hid_t id) {
    if (id >= 0) ids_.push_back(id);
    return id;
  }
  void close() {
    for (auto it = ids_.rbegin(); it != ids_.rend(); ++it) H5Idec_ref(*it);
    ids_.clear();
  }

 private:
  std::vector<hid_t> ids_;
};

std::string scratch(const char* what) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/troupe-fuzz-structure-" + std::to_string(getpid()) + what;
}

// What external links and external storage point at: reading it blocks forever, so a
// reader that follows one shows up as a hang.
const std::string& fifo_path() {
  static const std::string path = [] {
    std::string p = scratch(".fifo");
    ::unlink(p.c_str());
    if (::mkfifo(p.c_str(), 0600) != 0) std::abort();
    std::atexit([] { ::unlink(fifo_path().c_str()); });
    return p;
  }();
  return path;
}

hid_t half_type(Ids& ids) {
  hid_t t = ids.keep(H5Tcopy(H5T_IEEE_F32LE));
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

struct Type {
  hid_t id;
  const char* dtype;  // the troupe name that matches it
};

Type pick_type(Program& p, Ids& ids) {
  switch (p.pick(12)) {
    case 0: return {H5T_IEEE_F64LE, "f64"};
    case 1: return {half_type(ids), "f16"};
    case 2: return {H5T_STD_U16LE, "bf16"};
    case 3: return {H5T_STD_I32LE, "i32"};
    case 4: return {H5T_STD_I64LE, "i64"};
    case 5: return {H5T_STD_U8LE, "u8"};
    case 6: return {H5T_IEEE_F32BE, "f32"};  // byte-swapped: a file from elsewhere
    case 7: return {H5T_STD_I16LE, "i16"};
    case 8: {
      hid_t s = ids.keep(H5Tcopy(H5T_C_S1));
      H5Tset_size(s, 1 + p.pick(300));
      return {s, "u8"};
    }
    case 9: {
      hid_t wide = ids.keep(H5Tcopy(H5T_STD_I64LE));  // a 16-byte integer
      H5Tset_size(wide, 16);
      return {wide, "i64"};
    }
    default: return {H5T_IEEE_F32LE, "f32"};
  }
}

// Link and attribute names, among them ones a terminal or a path would misread.
std::string pick_name(Program& p) {
  static const char* const kNames[] = {"w",    "model",       "optimizer", "fc.weight",   "exp_avg",  "a",
                                       "b",    "step",        "dtype",     "xxh64",       "complete", "format",
                                       "x\ny", "\x1b[31mred", "..",        "caf\xc3\xa9", "\xff\xfe", " "};
  const std::size_t i = p.pick(std::size(kNames) + 2);
  if (i < std::size(kNames)) return kNames[i];
  if (i == std::size(kNames)) return std::string(200 + p.pick(200), 'n');
  return std::to_string(p.byte()) + "t";
}

hsize_t pick_dim(Program& p) {
  static const hsize_t kDims[] = {0,
                                  1,
                                  2,
                                  3,
                                  5,
                                  16,
                                  255,
                                  4096,
                                  hsize_t{1} << 20,
                                  hsize_t{1} << 31,
                                  hsize_t{1} << 32,
                                  hsize_t{1} << 40,
                                  hsize_t{1} << 62,
                                  (hsize_t{1} << 63) - 1,
                                  ~hsize_t{0} - 1};
  return kDims[p.pick(std::size(kDims))];
}

struct Builder {
  Program& p;
  Ids& ids;
  hid_t file;
  std::vector<std::string> groups{"/"};
  std::vector<std::string> objects{"/"};

  std::string new_path() {
    const std::string& parent = groups[p.pick(groups.size())];
    return (parent == "/" ? "/" : parent + "/") + pick_name(p);
  }

  void attribute(hid_t object) {
    const std::string name = pick_name(p);
    hid_t space = ids.keep(p.pick(4) == 0 ? H5Screate_simple(1, std::vector<hsize_t>{pick_dim(p) % 64}.data(), nullptr)
                                          : H5Screate(H5S_SCALAR));
    const std::size_t kind = p.pick(5);
    hid_t type = H5T_STD_I64LE;
    if (kind == 1) type = H5T_STD_U64LE;
    if (kind == 2) type = H5T_IEEE_F64LE;
    if (kind >= 3) {
      type = ids.keep(H5Tcopy(H5T_C_S1));
      H5Tset_size(type, kind == 3 ? H5T_VARIABLE : 1 + p.pick(40));
    }
    hid_t a = H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return;
    std::vector<char> value(4096, 0);
    for (std::size_t i = 0; i < 16; ++i) value[i] = static_cast<char>(p.byte());
    const hssize_t count = H5Sget_simple_extent_npoints(space);
    if (kind == 3) {  // one pointer per element
      const std::vector<const char*> texts(static_cast<std::size_t>(std::max<hssize_t>(count, 0)), "2.0");
      H5Awrite(a, type, texts.data());
    } else if (count * static_cast<hssize_t>(H5Tget_size(type)) <= 4096) {
      H5Awrite(a, type, value.data());
    }
    H5Aclose(a);
  }

  void dataset() {
    const std::string path = new_path();
    const Type type = pick_type(p, ids);
    const int rank = p.pick(8) == 0 ? 33 : static_cast<int>(p.pick(4));
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::min(rank, 33)));
    for (hsize_t& d : dims) d = p.pick(3) == 0 ? pick_dim(p) : 1 + p.pick(6);
    std::vector<hsize_t> max = dims;
    if (p.pick(4) == 0)
      for (hsize_t& m : max) m = H5S_UNLIMITED;
    hid_t space = ids.keep(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), max.data()));
    if (space < 0) return;
    // Multiplied out here: HDF5's own element count wraps ([2^32, 2^32] is 0 to it).
    long double real_bytes = H5Tget_size(type.id);
    for (const hsize_t d : dims) real_bytes *= static_cast<long double>(d);
    const bool small = real_bytes <= (64 << 10);
    const std::uint64_t bytes = small ? static_cast<std::uint64_t>(real_bytes) : ~std::uint64_t{0};
    hid_t dcpl = ids.keep(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_fill_time(dcpl, p.flag() ? H5D_FILL_TIME_NEVER : H5D_FILL_TIME_IFSET);
    const std::size_t layout = p.pick(6);
    // Outside the file (external storage, virtual): nothing is allocated or written,
    // which would open the FIFO.
    const bool outside = layout == 3 || layout == 4;
    // libhdf5 1.10's scale-offset and n-bit filters overrun their buffers when writing
    // some types and chunk shapes (ASan, in H5Z_pipeline and the chunk cache's flush):
    // a dataset with them gets no data, so that only the reader is fuzzed. Nor does one
    // with chunks over 1 MiB, which writing would fill whole (GBs, in minutes).
    bool unwritable = outside;
    switch (layout) {
      case 0: H5Pset_layout(dcpl, H5D_COMPACT); break;
      case 1:
      case 2: {
        std::vector<hsize_t> chunk(dims.size());
        long double chunk_bytes = H5Tget_size(type.id);
        for (hsize_t& c : chunk) chunk_bytes *= static_cast<long double>(c = p.pick(2) ? 1 + p.pick(8) : pick_dim(p));
        if (rank > 0) H5Pset_chunk(dcpl, rank, chunk.data());
        const unsigned filters = p.byte();
        if (filters & 1) H5Pset_shuffle(dcpl);
        if (filters & 2) H5Pset_deflate(dcpl, 1 + filters % 9);
        if (filters & 4) H5Pset_fletcher32(dcpl);
        if (filters & 8) H5Pset_scaleoffset(dcpl, H5Z_SO_INT, H5Z_SO_INT_MINBITS_DEFAULT);
        if (filters & 16) H5Pset_nbit(dcpl);
        unwritable = unwritable || (filters & 24) != 0 || chunk_bytes > (1 << 20);
        break;
      }
      case 3: H5Pset_external(dcpl, fifo_path().c_str(), 0, bytes > (1u << 30) ? H5F_UNLIMITED : bytes); break;
      case 4: {
        hid_t source = ids.keep(H5Screate_simple(rank > 0 ? rank : 1, dims.empty() ? nullptr : dims.data(), nullptr));
        if (rank > 0 && source >= 0) H5Pset_virtual(dcpl, space, fifo_path().c_str(), "/source", source);
        break;
      }
      default: H5Pset_layout(dcpl, H5D_CONTIGUOUS);
    }
    // Early allocation writes the whole extent into the file: only for small ones.
    if (small && !unwritable && p.flag()) H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    hid_t d = H5Dcreate2(file, path.c_str(), type.id, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d < 0) return;
    std::vector<unsigned char> data;
    std::uint64_t checksum = p.byte();
    if (small && !unwritable && p.pick(4) != 0) {
      data.resize(static_cast<std::size_t>(bytes));
      const std::uint8_t seed = p.byte();
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(seed + i * 31);
      if (H5Dwrite(d, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0 && p.pick(8) != 0)
        checksum = troupe::checkpoint::xxh64(data.data(), data.size());
    }
    if (p.pick(8) != 0) {  // troupe's two attributes, usually right
      static const char* const kDTypes[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "q7"};
      const std::string dtype = p.pick(4) != 0 ? type.dtype : kDTypes[p.pick(std::size(kDTypes))];
      write_string(d, "dtype", dtype);
      hid_t s = ids.keep(H5Screate(H5S_SCALAR));
      hid_t a = H5Acreate2(d, "xxh64", H5T_STD_U64LE, s, H5P_DEFAULT, H5P_DEFAULT);
      if (a >= 0) {
        H5Awrite(a, H5T_NATIVE_UINT64, &checksum);
        H5Aclose(a);
      }
    }
    H5Dclose(d);
    objects.push_back(path);
  }

  void write_string(hid_t object, const char* name, const std::string& value) {
    hid_t t = ids.keep(H5Tcopy(H5T_C_S1));
    H5Tset_size(t, std::max<std::size_t>(value.size(), 1));
    hid_t s = ids.keep(H5Screate(H5S_SCALAR));
    hid_t a = H5Acreate2(object, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return;
    std::string padded = value.empty() ? std::string(1, '\0') : value;
    H5Awrite(a, t, padded.data());
    H5Aclose(a);
  }

  void step() {
    switch (p.pick(8)) {
      case 0: {
        const std::string path = new_path();
        hid_t gcpl = ids.keep(H5Pcreate(H5P_GROUP_CREATE));
        if (p.flag()) H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
        hid_t g = H5Gcreate2(file, path.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT);
        if (g < 0) return;
        H5Gclose(g);
        groups.push_back(path);
        objects.push_back(path);
        return;
      }
      case 1:
      case 2: dataset(); return;
      case 3: {  // a second hard link: to an ancestor (a cycle), a sibling, itself
        // Through the open object: HDF5 takes no "/" as the source name of a link.
        hid_t o = H5Oopen(file, objects[p.pick(objects.size())].c_str(), H5P_DEFAULT);
        if (o < 0) return;
        H5Lcreate_hard(o, ".", file, new_path().c_str(), H5P_DEFAULT, H5P_DEFAULT);
        H5Oclose(o);
        return;
      }
      case 4: {
        const std::string target = p.flag() ? objects[p.pick(objects.size())] : "/no/such/object";
        H5Lcreate_soft(target.c_str(), file, new_path().c_str(), H5P_DEFAULT, H5P_DEFAULT);
        return;
      }
      case 5: H5Lcreate_external(fifo_path().c_str(), "/w", file, new_path().c_str(), H5P_DEFAULT, H5P_DEFAULT); return;
      case 6: {
        hid_t o = H5Oopen(file, objects[p.pick(objects.size())].c_str(), H5P_DEFAULT);
        if (o < 0) return;
        attribute(o);
        H5Oclose(o);
        return;
      }
      // No H5Ldelete: libhdf5 1.10 frees a dataset with external storage and then
      // encodes its freed file list when the file is closed (strlen(NULL), ASan).
      default: dataset(); return;
    }
  }

  // format, format_version and complete: usually as troupe writes them, so that reading
  // gets past the first checks; sometimes format 1's variable-length strings, or wrong.
  void root_attributes() {
    hid_t root = ids.keep(H5Gopen2(file, "/", H5P_DEFAULT));
    const std::size_t mode = p.pick(8);
    write_string(root, "format", mode == 7 ? "troupe" : "troupe-checkpoint");
    if (mode == 5 || mode == 6) {  // variable-length, as format 1 (5) or mislabelled 2.0 (6)
      hid_t t = ids.keep(H5Tcopy(H5T_C_S1));
      H5Tset_size(t, H5T_VARIABLE);
      hid_t s = ids.keep(H5Screate(H5S_SCALAR));
      hid_t a = ids.keep(H5Acreate2(root, "format_version", t, s, H5P_DEFAULT, H5P_DEFAULT));
      const char* version = mode == 5 ? "1.0" : "2.0";
      H5Awrite(a, t, &version);
    } else {
      write_string(root, "format_version", "2.0");
    }
    hid_t s = ids.keep(H5Screate(H5S_SCALAR));
    if (mode != 4) {
      hid_t a = ids.keep(H5Acreate2(root, "complete", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT));
      const std::int64_t one = 1;
      H5Awrite(a, H5T_NATIVE_INT64, &one);
    }
  }
};

// Builds the file `input` describes at `path`; false when HDF5 would not create it.
bool build(Program& p, const std::string& path) {
  Ids ids;  // closed before the file, so that closing it writes everything
  hid_t fcpl = ids.keep(H5Pcreate(H5P_FILE_CREATE));
  if (p.flag()) {
    H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    H5Pset_attr_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  }
  hid_t fapl = ids.keep(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  if (p.flag()) H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl);
  if (file < 0) return false;
  Builder b{p, ids, file};
  b.root_attributes();
  for (int steps = 0; steps < 48 && !p.done(); ++steps) b.step();
  ids.close();
  return H5Fclose(file) >= 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = scratch(".h5");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the builder's calls fail often, by design
  Program program(data, size);
  const bool allow_format_1 = program.flag();
  if (build(program, path)) {
    const std::uint64_t file_size = std::filesystem::file_size(path);
    try {
      troupe::checkpoint::FileReader reader(path, {.allow_format_1 = allow_format_1});
      reader.attributes("/");
      for (const std::string& group : reader.groups("/")) reader.attributes(group);
      for (const troupe::checkpoint::TensorInfo& info : reader.tensors("/")) {
        // The reader's promise: no size it lists is more than the file can back.
        if (info.nbytes() > 1032 * file_size) {
          std::fprintf(stderr, "%s: %zu bytes listed from a %llu-byte file\n", info.path.c_str(), info.nbytes(),
                       static_cast<unsigned long long>(file_size));
          std::abort();
        }
        const troupe::tensor::Tensor t = reader.read(info.path);
        if (t.numel() > 0) reader.read_range(info.path, t.numel() - 1, t.numel());
      }
      reader.verify_all();
    } catch (const troupe::Error&) {
    }
  }
  // To look at what an input builds (h5dump, troupe-ckpt): TROUPE_FUZZ_KEEP=copy.h5.
  if (const char* keep = std::getenv("TROUPE_FUZZ_KEEP"))
    std::filesystem::copy_file(path, keep, std::filesystem::copy_options::overwrite_existing);
  std::remove(path.c_str());
  return 0;
}
