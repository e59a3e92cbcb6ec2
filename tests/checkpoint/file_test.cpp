// FileWriter / FileReader: bit-exact round trips and clear refusals of bad files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "test_util.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/file_writer.hpp"

namespace troupe::checkpoint {
namespace {

using tensor::DType;
using tensor::Shape;
using tensor::Tensor;
using testing::TempDir;

TEST(CheckpointFile, EveryDTypeAndShapeRoundTripsBitForBit) {
  TempDir dir;
  std::string path = dir / "all.h5";
  std::vector<std::pair<std::string, Tensor>> written;
  std::uint32_t seed = 1;
  for (DType dtype : tensor::kAllDTypes) {
    for (const Shape& shape : {Shape{}, Shape{0}, Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{4, 0, 2}}) {
      std::string name = "/model/" + std::string(tensor::dtype_name(dtype)) + "." + tensor::to_string(shape);
      written.emplace_back(name, testing::random_tensor(shape, dtype, seed++));
    }
  }
  {
    FileWriter out(path);
    for (auto& [name, t] : written) out.write_tensor(name, t);
    out.close();
  }
  FileReader in(path);
  std::vector<TensorInfo> listed = in.tensors("/");
  ASSERT_EQ(listed.size(), written.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ(listed[i].path, written[i].first) << "listing keeps the order of writing";
    EXPECT_EQ(listed[i].dtype, written[i].second.dtype());
    EXPECT_EQ(listed[i].shape, written[i].second.shape());
    Tensor back = in.read(written[i].first);
    EXPECT_TRUE(testing::same_bits(back, written[i].second)) << written[i].first;
  }
}

TEST(CheckpointFile, ViewsAtAnOffsetAreWrittenAsTheirOwnElements) {
  TempDir dir;
  Tensor flat = Tensor::arange(0, 100, 1, DType::f32);
  Tensor view = flat.slice(10, 30).reshape({4, 5});
  {
    FileWriter out(dir / "v.h5");
    out.write_tensor("/model/v", view);
    out.close();
  }
  Tensor back = FileReader(dir / "v.h5").read("/model/v");
  EXPECT_EQ(back.to_vector<float>(), view.to_vector<float>());
}

TEST(CheckpointFile, AttributesRoundTripInOrderOnRootAndGroups) {
  TempDir dir;
  {
    FileWriter out(dir / "a.h5");
    out.set_attribute("/", "step", std::int64_t{1200});
    out.set_attribute("/", "config", std::string("{\"lr\": 0.1}"));
    out.set_attribute("/sampler", "epoch", std::int64_t{3});
    out.set_attribute("/sampler", "lr", 0.25);
    out.set_attribute("/sampler", "epoch", std::int64_t{4});  // replaces
    out.close();
  }
  FileReader in(dir / "a.h5");
  Attributes root = in.attributes("/");
  EXPECT_EQ(root.get_string("format"), "troupe-checkpoint");
  EXPECT_EQ(root.get_int("step"), 1200);
  EXPECT_EQ(root.get_string("config"), "{\"lr\": 0.1}");
  Attributes sampler = in.attributes("/sampler");
  EXPECT_EQ(sampler.get_int("epoch"), 4);
  EXPECT_EQ(sampler.get_double("lr"), 0.25);
  EXPECT_EQ(sampler.size(), 2u);
  EXPECT_TRUE(in.has_group("/sampler"));
  EXPECT_FALSE(in.has_group("/nothing/here"));
  EXPECT_THROW(sampler.get_string("epoch"), FormatError);
}

TEST(CheckpointFile, StringsOfAnyLengthRoundTripFixedLength) {
  TempDir dir;
  std::string big(100'000, 'x');  // beyond the 64 KiB an object header message holds
  big.replace(0, 4, "\xce\xbb=1");
  {
    FileWriter out(dir / "s.h5");
    out.set_attribute("/", "empty", std::string());
    out.set_attribute("/", "big", big);
    out.set_attribute("/sampler", "name", std::string("\xe2\x80\x94 dash"));
    out.close();
  }
  FileReader in(dir / "s.h5");
  EXPECT_EQ(in.attributes("/").get_string("format_version"), "2.0");
  EXPECT_EQ(in.attributes("/").get_string("empty"), "");
  EXPECT_EQ(in.attributes("/").get_string("big"), big);
  EXPECT_EQ(in.attributes("/sampler").get_string("name"), "\xe2\x80\x94 dash");
  // h5py sees fixed-length strings (it returns them as bytes), none in the global heap.
  std::string cmd = "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + (dir / "s.h5").string() +
                    "', 'r'); assert not any(h5py.check_vlen_dtype(f.attrs.get_id(n).dtype) "
                    "for n in f.attrs), 'a variable-length string'\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

// A format 1 file (strings variable-length) is still read when asked, tensors verified.
TEST(CheckpointFile, FormatOneFilesWithVariableLengthStringsAreRead) {
  TempDir dir;
  Tensor w = Tensor::arange(0, 6, 1, DType::f32).to(DType::bf16).reshape({2, 3});
  {
    FileWriter out(dir / "old.h5");
    out.write_tensor("/model/w", w);
    out.set_attribute("/", "config", std::string("{}"));
    out.set_attribute("/model", "note", std::string("kept"));
    out.close();
  }
  std::string cmd =
      "/usr/bin/python3 " TROUPE_SOURCE_DIR "/tests/checkpoint/as_format1.py " + (dir / "old.h5").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  FileReader in(dir / "old.h5", {.allow_format_1 = true});
  EXPECT_EQ(in.attributes("/").get_string("format_version"), "1.0");
  EXPECT_EQ(in.attributes("/").get_string("config"), "{}");
  EXPECT_EQ(in.attributes("/model").get_string("note"), "kept");
  Tensor back = in.read("/model/w");
  EXPECT_EQ(back.dtype(), DType::bf16);
  EXPECT_EQ(std::memcmp(back.raw_data(), w.raw_data(), w.nbytes()), 0);
  in.verify_all();
}

// libhdf5 1.10 can overrun or hang on a damaged variable-length string, so a format 2
// file is read without touching one: a variable-length string in it is refused by name.
TEST(CheckpointFile, AVariableLengthStringInAFormatTwoFileIsRefusedByName) {
  TempDir dir;
  {
    FileWriter out(dir / "c.h5");
    out.write_tensor("/model/w", Tensor::ones({2}));
    out.close();
  }
  std::string file = (dir / "c.h5").string();
  std::string cmd = "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + file +
                    "', 'r+'); f['model'].attrs['note'] = 'added by h5py'; f.close()\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  {
    FileReader in(file);
    EXPECT_NO_THROW(in.read("/model/w"));
    try {
      in.attributes("/model");
      FAIL() << "a variable-length string was read";
    } catch (const FormatError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("'note'"), std::string::npos) << what;
      EXPECT_NE(what.find("variable-length"), std::string::npos) << what;
      EXPECT_NE(what.find(file), std::string::npos) << what;
    }
  }
  // The same in a dataset's own attribute, where reading the tensor needs it.
  cmd = "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + file +
        "', 'r+'); w = f['model/w']; del w.attrs['dtype']; w.attrs['dtype'] = 'f32'; f.close()\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  FileReader again(file);
  EXPECT_THROW(again.read("/model/w"), FormatError);
}

TEST(CheckpointFile, UnknownMajorVersionsAndMislabelledVersionsAreRefused) {
  TempDir dir;
  std::string file = (dir / "v.h5").string();
  auto write = [&] {
    FileWriter out(file);
    out.write_tensor("/model/w", Tensor::ones({2}));
    out.close();
  };
  auto refusal = [&] {
    try {
      FileReader in(file);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  write();
  std::string cmd = "/usr/bin/python3 -c \"import h5py, numpy; f = h5py.File('" + file +
                    "', 'r+'); del f.attrs['format_version']; "
                    "f.attrs.create('format_version', numpy.bytes_(b'3.0')); f.close()\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_NE(refusal().find("reads major versions 1 to 2"), std::string::npos) << refusal();
  // Variable-length strings claiming format 2: no writer made that.
  write();
  cmd = "/usr/bin/python3 " TROUPE_SOURCE_DIR "/tests/checkpoint/as_format1.py " + file + " 2.0";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_NE(refusal().find("variable-length string"), std::string::npos) << refusal();
}

TEST(CheckpointFile, AFlippedDataByteFailsVerificationNamingTheDataset) {
  TempDir dir;
  Tensor t = Tensor::arange(1000, 2000, 1, DType::f32);  // a pattern findable in the file
  {
    FileWriter out(dir / "c.h5");
    out.write_tensor("/model/layers.0.weight", t);
    out.write_tensor("/model/other", Tensor::ones({10}));
    out.close();
  }
  std::vector<char> bytes = testing::read_bytes(dir / "c.h5");
  const char* needle = static_cast<const char*>(t.raw_data());
  auto at = std::search(bytes.begin(), bytes.end(), needle, needle + 64);
  ASSERT_NE(at, bytes.end());
  at[200] ^= 0x01;
  testing::write_bytes(dir / "c.h5", bytes);

  FileReader in(dir / "c.h5");  // metadata is intact: opens
  EXPECT_NO_THROW(in.read("/model/other"));
  try {
    in.read("/model/layers.0.weight");
    FAIL() << "corruption not detected";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/model/layers.0.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(in.verify_all(), FormatError);
  EXPECT_NO_THROW(in.read("/model/layers.0.weight", /*verify=*/false));
}

// Tensors of 8 MB and more are verified while they are read (a second thread hashes
// the chunks already in): damage in any chunk, the last one included, is still caught,
// and a good tensor reads back exact.
TEST(CheckpointFile, ALargeTensorIsHashedWhileReadAndADamagedChunkIsCaught) {
  TempDir dir;
  Tensor big = testing::random_tensor({3, 1024, 1024}, DType::f32, 11);  // 12 MB: three 4 MB chunks
  {
    FileWriter out(dir / "big.h5");
    out.write_tensor("/model/big", big);
    out.close();
  }
  {
    FileReader in(dir / "big.h5");
    Tensor back = in.read("/model/big");
    ASSERT_EQ(back.nbytes(), big.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), big.raw_data(), big.nbytes()), 0);
  }
  const std::vector<char> good = testing::read_bytes(dir / "big.h5");
  const char* first = static_cast<const char*>(big.raw_data());
  const auto start = std::search(good.begin(), good.end(), first, first + 64);
  ASSERT_NE(start, good.end());
  for (std::size_t at : {std::size_t{5} << 20, big.nbytes() - 1}) {  // the second chunk; the very last byte
    std::vector<char> bytes = good;
    bytes[static_cast<std::size_t>(start - good.begin()) + at] ^= 0x10;
    testing::write_bytes(dir / "big.h5", bytes);
    FileReader in(dir / "big.h5");
    try {
      in.read("/model/big");
      ADD_FAILURE() << "damage at byte " << at << " not detected";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    }
  }
  // Cut in the middle of the tensor: refused at open or read, never returned short.
  testing::write_bytes(dir / "big.h5", std::vector<char>(good.begin(), start + (std::ptrdiff_t{6} << 20)));
  EXPECT_THROW(
      {
        FileReader in(dir / "big.h5");
        in.read("/model/big");
      },
      FormatError);
}

TEST(CheckpointFile, TruncatedFileIsRejectedAtOpenOrRead) {
  TempDir dir;
  {
    FileWriter out(dir / "t.h5");
    out.write_tensor("/model/w", testing::random_tensor({256, 256}, DType::f32, 7));
    out.close();
  }
  std::vector<char> bytes = testing::read_bytes(dir / "t.h5");
  for (std::size_t keep : {bytes.size() / 2, bytes.size() - 1, std::size_t{100}, std::size_t{0}}) {
    testing::write_bytes(dir / "t.h5", std::vector<char>(bytes.begin(), bytes.begin() + keep));
    EXPECT_THROW(
        {
          FileReader in(dir / "t.h5");
          in.verify_all();
        },
        FormatError)
        << "kept " << keep << " of " << bytes.size() << " bytes";
  }
}

TEST(CheckpointFile, MissingNonHdf5AndIncompleteFilesGetClearErrors) {
  TempDir dir;
  try {
    FileReader in(dir / "absent.h5");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
  }
  testing::write_bytes(dir / "text.h5", std::vector<char>(1000, 'x'));
  try {
    FileReader in(dir / "text.h5");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("not an HDF5 file"), std::string::npos) << e.what();
  }
  {
    FileWriter out(dir / "cut.h5");
    out.write_tensor("/model/w", Tensor::ones({4}));
    // destroyed without close(): the writer stopped half way
  }
  try {
    FileReader in(dir / "cut.h5");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("complete"), std::string::npos) << e.what();
  }
}

TEST(CheckpointFile, AForeignHdf5FileIsNotTakenForACheckpoint) {
  TempDir dir;
  std::string path = dir / "foreign.h5";
  std::string cmd =
      "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + path + "', 'w'); f['x'] = [1, 2, 3]; f.close()\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  try {
    FileReader in(path);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("not a troupe checkpoint"), std::string::npos) << e.what();
  }
}

TEST(CheckpointFile, BadPathsAreRefusedWithTheName) {
  TempDir dir;
  FileWriter out(dir / "p.h5");
  EXPECT_THROW(out.write_tensor("model/w", Tensor::ones({1})), InvalidArgument);
  EXPECT_THROW(out.write_tensor("/model//w", Tensor::ones({1})), InvalidArgument);
  EXPECT_THROW(out.write_tensor("/model/w", Tensor()), InvalidArgument);
  out.write_tensor("/model/w", Tensor::ones({1}));
  EXPECT_THROW(out.write_tensor("/model/w", Tensor::ones({1})), CheckpointError);  // twice
}

}  // namespace
}  // namespace troupe::checkpoint
