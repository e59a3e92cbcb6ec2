#include "h5_types.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "h5_call.hpp"
#include "troupe/checkpoint/format.hpp"
#include "troupe/checkpoint/printable.hpp"

namespace troupe::checkpoint::detail {

using tensor::DType;

namespace {

// IEEE 754 binary16, built the way h5py builds it so h5py maps it to numpy float16:
// sign bit 15, exponent bits 10..14 with bias 15, mantissa bits 0..9.
hid_t make_half_type() {
  hid_t t = h5_check(H5Tcopy(H5T_IEEE_F32LE), "H5Tcopy(half)");
  h5_check(H5Tset_fields(t, 15, 10, 5, 0, 10), "H5Tset_fields(half)");
  h5_check(H5Tset_size(t, 2), "H5Tset_size(half)");
  h5_check(H5Tset_ebias(t, 15), "H5Tset_ebias(half)");
  h5_check(H5Tlock(t), "H5Tlock(half)");
  return t;
}

// `size` bytes, or H5T_VARIABLE.
hid_t utf8_string_type(size_t size) {
  hid_t t = h5_check(H5Tcopy(H5T_C_S1), "H5Tcopy(string)");
  h5_check(H5Tset_size(t, size), "H5Tset_size(string)");
  h5_check(H5Tset_cset(t, H5T_CSET_UTF8), "H5Tset_cset(string)");
  if (size != H5T_VARIABLE) h5_check(H5Tset_strpad(t, H5T_STR_NULLPAD), "H5Tset_strpad(string)");
  return t;
}

// The dtype an HDF5 type stands for when there is no dtype attribute.
std::optional<DType> infer(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 8) return DType::f64;
    if (size == 4) return DType::f32;
    if (size == 2) return DType::f16;
  } else if (cls == H5T_INTEGER) {
    H5T_sign_t sign = H5Tget_sign(type);
    if (size == 8 && sign == H5T_SGN_2) return DType::i64;
    if (size == 4 && sign == H5T_SGN_2) return DType::i32;
    if (size == 1 && sign == H5T_SGN_NONE) return DType::u8;
    if (size == 2 && sign == H5T_SGN_NONE) return DType::bf16;  // only with the attribute, below
  }
  return std::nullopt;
}

}  // namespace

hid_t h5_type_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return H5T_IEEE_F32LE;
    case DType::f64: return H5T_IEEE_F64LE;
    case DType::f16: {
      static const hid_t half = make_half_type();
      return half;
    }
    case DType::bf16: return H5T_STD_U16LE;
    case DType::i32: return H5T_STD_I32LE;
    case DType::i64: return H5T_STD_I64LE;
    case DType::u8: return H5T_STD_U8LE;
  }
  TROUPE_THROW(InvalidArgument, "checkpoint: corrupt dtype value ", static_cast<int>(dtype));
}

DType dtype_of_dataset(hid_t dataset, const std::string& where, StringStorage strings) {
  Handle type(h5_check(H5Dget_type(dataset), "H5Dget_type " + where, Failure::format), H5Tclose);
  std::optional<DType> inferred = infer(type.get());
  std::optional<AttrValue> attr = read_attribute(dataset, kAttrDType, where, strings);
  if (!attr) {
    if (!inferred || *inferred == DType::bf16)
      TROUPE_THROW(FormatError, where, ": HDF5 type (class ", H5Tget_class(type.get()), ", ", H5Tget_size(type.get()),
                   " bytes) has no troupe dtype and no dtype attribute");
    return *inferred;
  }
  const std::string* name = std::get_if<std::string>(&*attr);
  if (!name) TROUPE_THROW(FormatError, where, ": dtype attribute is not a string");
  DType declared;
  try {
    declared = tensor::dtype_from_name(*name);
  } catch (const InvalidArgument&) {
    TROUPE_THROW(FormatError, where, ": unknown dtype attribute \"", printable(*name), "\"");
  }
  if (!inferred || *inferred != declared || H5Tget_size(type.get()) != tensor::element_size(declared))
    TROUPE_THROW(FormatError, where, ": dtype attribute says ", printable(*name), " but the HDF5 type is class ",
                 H5Tget_class(type.get()), " of ", H5Tget_size(type.get()), " bytes");
  return declared;
}

void write_attribute(hid_t object, std::string_view name, const AttrValue& value, const std::string& where) {
  std::string key(name);
  std::string what = "attribute '" + key + "' on " + where;
  // Replacing keeps set_attribute idempotent (a section may set a value twice).
  if (h5_check(H5Aexists(object, key.c_str()), "H5Aexists " + what) > 0)
    h5_check(H5Adelete(object, key.c_str()), "H5Adelete " + what);
  Handle space(h5_check(H5Screate(H5S_SCALAR), "H5Screate " + what), H5Sclose);
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    Handle a(h5_check(H5Acreate2(object, key.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      "H5Acreate2 " + what),
             H5Aclose);
    h5_check(H5Awrite(a.get(), H5T_NATIVE_INT64, i), "H5Awrite " + what);
  } else if (const auto* d = std::get_if<double>(&value)) {
    Handle a(h5_check(H5Acreate2(object, key.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      "H5Acreate2 " + what),
             H5Aclose);
    h5_check(H5Awrite(a.get(), H5T_NATIVE_DOUBLE, d), "H5Awrite " + what);
  } else {
    // Fixed-length (format 2): a variable-length string lives in the global heap, which
    // libhdf5 1.10 reads without bounds checks (docs/CHECKPOINT_FORMAT.md).
    const std::string& s = std::get<std::string>(value);
    Handle type(utf8_string_type(std::max<size_t>(s.size(), 1)), H5Tclose);
    Handle a(h5_check(H5Acreate2(object, key.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      "H5Acreate2 " + what),
             H5Aclose);
    std::string padded = s.empty() ? std::string(1, '\0') : s;
    h5_check(H5Awrite(a.get(), type.get(), padded.data()), "H5Awrite " + what);
  }
}

void write_u64_attribute(hid_t object, std::string_view name, std::uint64_t value, const std::string& where) {
  std::string key(name);
  std::string what = "attribute '" + key + "' on " + where;
  Handle space(h5_check(H5Screate(H5S_SCALAR), "H5Screate " + what), H5Sclose);
  Handle a(h5_check(H5Acreate2(object, key.c_str(), H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    "H5Acreate2 " + what),
           H5Aclose);
  h5_check(H5Awrite(a.get(), H5T_NATIVE_UINT64, &value), "H5Awrite " + what);
}

namespace {

std::optional<AttrValue> read_open_attribute(hid_t a, const std::string& what, StringStorage strings) {
  Handle space(h5_check(H5Aget_space(a), "H5Aget_space " + what, Failure::format), H5Sclose);
  if (H5Sget_simple_extent_type(space.get()) != H5S_SCALAR) return std::nullopt;
  Handle type(h5_check(H5Aget_type(a), "H5Aget_type " + what, Failure::format), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  // A number is read by converting it to 8 bytes, through a buffer of its own declared
  // size, which a crafted type makes gigabytes: wider ones are skipped, as arrays are.
  if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && H5Tget_size(type.get()) > 8) return std::nullopt;
  switch (cls) {
    case H5T_INTEGER: {
      std::int64_t v = 0;
      if (H5Tget_sign(type.get()) == H5T_SGN_NONE && H5Tget_size(type.get()) == 8) {
        std::uint64_t u = 0;
        h5_check(H5Aread(a, H5T_NATIVE_UINT64, &u), "H5Aread " + what, Failure::format);
        std::memcpy(&v, &u, sizeof v);
      } else {
        h5_check(H5Aread(a, H5T_NATIVE_INT64, &v), "H5Aread " + what, Failure::format);
      }
      return AttrValue(v);
    }
    case H5T_FLOAT: {
      double v = 0;
      h5_check(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "H5Aread " + what, Failure::format);
      return AttrValue(v);
    }
    case H5T_STRING: {
      if (H5Tis_variable_str(type.get()) > 0) {
        if (strings != StringStorage::variable)
          TROUPE_THROW(FormatError, what, " is a variable-length string, which a format ", kFormatMajor,
                       " file never holds: the file is damaged, or it was added "
                       "by another tool (store it fixed-length, e.g. h5py's "
                       "attrs.create(name, numpy.bytes_(text)))");
        Handle mem(utf8_string_type(H5T_VARIABLE), H5Tclose);
        char* p = nullptr;
        h5_check(H5Aread(a, mem.get(), &p), "H5Aread " + what, Failure::format);
        std::string s = p ? p : "";
        H5free_memory(p);
        return AttrValue(s);
      }
      size_t size = H5Tget_size(type.get());
      if (size == 0 || size > H5Aget_storage_size(a))
        TROUPE_THROW(FormatError, what, ": a string of ", size, " bytes in ", H5Aget_storage_size(a),
                     " bytes of storage");
      std::string s(size, '\0');
      h5_check(H5Aread(a, type.get(), s.data()), "H5Aread " + what, Failure::format);
      s.resize(std::strlen(s.c_str()));  // fixed-length strings are NUL padded
      return AttrValue(s);
    }
    default: return std::nullopt;
  }
}

}  // namespace

std::optional<AttrValue> read_attribute(hid_t object, std::string_view name, const std::string& where,
                                        StringStorage strings) {
  std::string key(name);
  std::string what = "attribute '" + key + "' on " + where;
  if (h5_check(H5Aexists(object, key.c_str()), "H5Aexists " + what, Failure::format) <= 0) return std::nullopt;
  Handle a(h5_check(H5Aopen(object, key.c_str(), H5P_DEFAULT), "H5Aopen " + what, Failure::format), H5Aclose);
  return read_open_attribute(a.get(), what, strings);
}

std::optional<std::uint64_t> read_u64_attribute(hid_t object, std::string_view name, const std::string& where,
                                                StringStorage strings) {
  std::optional<AttrValue> v = read_attribute(object, name, where, strings);
  if (!v) return std::nullopt;
  const auto* i = std::get_if<std::int64_t>(&*v);
  if (!i) TROUPE_THROW(FormatError, where, ": attribute '", name, "' is not an integer");
  std::uint64_t u;
  std::memcpy(&u, i, sizeof u);
  return u;
}

Attributes read_attributes(hid_t object, const std::string& where, StringStorage strings) {
  H5O_info_t info;
  h5_check(H5Oget_info2(object, &info, H5O_INFO_NUM_ATTRS), "H5Oget_info " + where, Failure::format);
  Attributes out;
  if (info.num_attrs == 0) return out;
  // Creation order when the object tracks it (ours do), name order otherwise -- its
  // own property, not a guess from whether the first lookup works on a damaged file.
  H5_index_t index = H5_INDEX_NAME;
  const H5I_type_t kind = H5Iget_type(object);
  if (kind == H5I_GROUP || kind == H5I_DATASET) {
    Handle plist(h5_check(kind == H5I_GROUP ? H5Gget_create_plist(object) : H5Dget_create_plist(object),
                          "the creation properties of " + where, Failure::format),
                 H5Pclose);
    unsigned order = 0;
    h5_check(H5Pget_attr_creation_order(plist.get(), &order), "H5Pget_attr_creation_order " + where, Failure::format);
    if (order & H5P_CRT_ORDER_TRACKED) index = H5_INDEX_CRT_ORDER;
  }
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    Handle a(h5_check(H5Aopen_by_idx(object, ".", index, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT),
                      "H5Aopen_by_idx " + where, Failure::format),
             H5Aclose);
    ssize_t len = H5Aget_name(a.get(), 0, nullptr);
    std::string name(static_cast<size_t>(len > 0 ? len : 0), '\0');
    H5Aget_name(a.get(), name.size() + 1, name.data());
    if (auto v = read_open_attribute(a.get(), "attribute '" + printable(name) + "' on " + where, strings))
      out.set(name, std::move(*v));
  }
  return out;
}

StringStorage string_storage_of(hid_t root, const std::string& where) {
  std::string key(kAttrFormatVersion);
  std::string what = "attribute '" + key + "' on " + where;
  if (h5_check(H5Aexists(root, key.c_str()), "H5Aexists " + what, Failure::format) <= 0) return StringStorage::fixed;
  Handle a(h5_check(H5Aopen(root, key.c_str(), H5P_DEFAULT), "H5Aopen " + what, Failure::format), H5Aclose);
  Handle type(h5_check(H5Aget_type(a.get()), "H5Aget_type " + what, Failure::format), H5Tclose);
  return H5Tget_class(type.get()) == H5T_STRING && H5Tis_variable_str(type.get()) > 0 ? StringStorage::variable
                                                                                      : StringStorage::fixed;
}

}  // namespace troupe::checkpoint::detail
