// The mapping between troupe dtypes / attribute values and HDF5 types, in one place so
// writer and reader cannot disagree: f32/f64 are IEEE little-endian floats, f16 the
// 16-bit IEEE half h5py builds (numpy float16), bf16 plain uint16 words (HDF5 and numpy
// have no bfloat16; the dataset's dtype attribute says "bf16"), integers little-endian.
// Strings are variable-length UTF-8 scalars, which h5py returns as str.
#pragma once

#include <hdf5.h>

#include <optional>
#include <string>
#include <string_view>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/tensor/dtype.hpp"

namespace troupe::checkpoint::detail {

// A type id owned by this module for the whole process; callers must not close it.
hid_t h5_type_of(tensor::DType dtype);
// The troupe dtype a dataset holds: its dtype attribute when present (it is the only way
// to tell bf16 from uint16), checked against the HDF5 type; otherwise inferred from the
// HDF5 type (for files written by h5py). `where` names file and dataset for errors.
tensor::DType dtype_of_dataset(hid_t dataset, const std::string& where);

void write_attribute(hid_t object, std::string_view name, const AttrValue& value,
                     const std::string& where);
void write_u64_attribute(hid_t object, std::string_view name, std::uint64_t value,
                         const std::string& where);
std::optional<AttrValue> read_attribute(hid_t object, std::string_view name,
                                        const std::string& where);
std::optional<std::uint64_t> read_u64_attribute(hid_t object, std::string_view name,
                                                const std::string& where);
// Every scalar attribute of `object` that maps onto AttrValue, in creation order when the
// file tracks it; others (arrays, compound types) are skipped.
Attributes read_attributes(hid_t object, const std::string& where);

}  // namespace troupe::checkpoint::detail
