// The mapping between troupe dtypes / attribute values and HDF5 types, in one place so
// writer and reader cannot disagree: f32/f64 are IEEE little-endian floats, f16 the
// 16-bit IEEE half h5py builds (numpy float16), bf16 plain uint16 words (HDF5 and numpy
// have no bfloat16; the dataset's dtype attribute says "bf16"), integers little-endian.
// Strings are fixed-length UTF-8 scalars, NUL padded (h5py returns bytes); format 1
// files held variable-length ones, which are read only from such files.
#pragma once

#include <hdf5.h>

#include <optional>
#include <string>
#include <string_view>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/tensor/dtype.hpp"

namespace troupe::checkpoint::detail {

// Whether a file's string attributes may be variable-length: only in a format 1 file,
// told by the type of its root format_version. Reading one goes through libhdf5 1.10's
// global heap, which overruns, crashes or loops on a damaged heap object, so a file
// of the current format that holds one is refused instead.
enum class StringStorage { fixed, variable };
StringStorage string_storage_of(hid_t root, const std::string& where);

// A type id owned by this module for the whole process; callers must not close it.
hid_t h5_type_of(tensor::DType dtype);
// The troupe dtype a dataset holds: its dtype attribute when present (it is the only way
// to tell bf16 from uint16), checked against the HDF5 type; otherwise inferred from the
// HDF5 type (for files written by h5py). `where` names file and dataset for errors.
tensor::DType dtype_of_dataset(hid_t dataset, const std::string& where, StringStorage strings);

void write_attribute(hid_t object, std::string_view name, const AttrValue& value, const std::string& where);
void write_u64_attribute(hid_t object, std::string_view name, std::uint64_t value, const std::string& where);
std::optional<AttrValue> read_attribute(hid_t object, std::string_view name, const std::string& where,
                                        StringStorage strings);
std::optional<std::uint64_t> read_u64_attribute(hid_t object, std::string_view name, const std::string& where,
                                                StringStorage strings);
// Every scalar attribute of `object` that maps onto AttrValue, in creation order when the
// file tracks it; others (arrays, compound types, numbers wider than 8 bytes) are skipped.
Attributes read_attributes(hid_t object, const std::string& where, StringStorage strings);

}  // namespace troupe::checkpoint::detail
