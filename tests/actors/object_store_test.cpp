// ObjectStore (actors/src/object_store.hpp): the bound in memory, spilling to disk past
// it, reading spilled objects back, and failures of the spill folder. A store is local
// to its rank: every rank runs these on its own folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "object_store.hpp"
#include "troupe/actors/errors.hpp"

using troupe::actors::Bytes;
using troupe::actors::ErrorCode;
using troupe::actors::RemoteError;
using troupe::actors::detail::ObjectStore;
using troupe::actors::detail::ObjectStoreOptions;
namespace fs = std::filesystem;

namespace {

// A fresh folder of this process's, removed at the end of the test.
struct Folder {
  fs::path path = fs::temp_directory_path() / ("troupe-object-store-test-" + std::to_string(::getpid()) + "-" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Folder() { fs::remove_all(path); }
  ~Folder() { fs::remove_all(path); }
  std::size_t files() const {
    std::size_t n = 0;
    if (fs::exists(path))
      for (const auto& entry : fs::recursive_directory_iterator(path)) n += entry.is_regular_file() ? 1 : 0;
    return n;
  }
  fs::path only_file() const {
    for (const auto& entry : fs::recursive_directory_iterator(path))
      if (entry.is_regular_file()) return entry.path();
    return {};
  }
};

Bytes pattern(std::size_t size, int seed) {
  std::vector<std::byte> data(size);
  for (std::size_t i = 0; i < size; ++i)
    data[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(seed)) & 0xff);
  return Bytes(std::move(data));
}

// Stores an object of `header` bytes and one attachment of `size` bytes.
std::uint64_t put(ObjectStore& store, std::size_t size, int seed) {
  return store.store(std::string(8, static_cast<char>('a' + seed)), {pattern(size, seed)}, 1);
}

void expect_object(const ObjectStore& store, std::uint64_t id, std::size_t size, int seed) {
  const auto [bytes, attachments] = store.load(id);
  EXPECT_EQ(bytes, std::string(8, static_cast<char>('a' + seed)));
  ASSERT_EQ(attachments.size(), 1u);
  EXPECT_TRUE(attachments[0] == pattern(size, seed)) << "object " << id << " read back different bytes";
}

ErrorCode code_of(const std::function<void()>& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const RemoteError& e) {
    if (what) *what = e.what();
    return e.code();
  }
  ADD_FAILURE() << "no RemoteError";
  return ErrorCode::remote_exception;
}

}  // namespace

TEST(ObjectStore, WithoutAFolderAnObjectPastTheBoundIsRefused) {
  ObjectStore store(0, ObjectStoreOptions{1000, ""});
  const auto first = put(store, 600, 1);
  std::string what;
  EXPECT_EQ(code_of([&] { put(store, 600, 2); }, &what), ErrorCode::overloaded);
  EXPECT_NE(what.find("object_spill_folder"), std::string::npos) << what;
  expect_object(store, first, 600, 1);
  EXPECT_EQ(store.memory_bytes(), 608u);
}

TEST(ObjectStore, SpillsTheOldestObjectsToStayWithinItsBoundAndReadsThemBack) {
  Folder folder;
  ObjectStore store(0, ObjectStoreOptions{1000, folder.path.string()});
  const auto a = put(store, 392, 1), b = put(store, 392, 2);  // 400 bytes each
  EXPECT_EQ(store.spilled_bytes(), 0u);
  EXPECT_EQ(folder.files(), 0u);
  const auto c = put(store, 392, 3);  // a goes to disk
  EXPECT_EQ(store.memory_bytes(), 800u);
  EXPECT_EQ(store.spilled_bytes(), 400u);
  EXPECT_EQ(store.spilled_objects(), 1u);
  EXPECT_EQ(folder.files(), 1u);
  const auto d = put(store, 792, 4);  // 800 bytes: b and c go too
  EXPECT_EQ(store.memory_bytes(), 800u);
  EXPECT_EQ(store.spilled_bytes(), 1200u);
  for (int twice = 0; twice < 2; ++twice) {  // a spilled object stays readable
    expect_object(store, a, 392, 1);
    expect_object(store, b, 392, 2);
    expect_object(store, c, 392, 3);
    expect_object(store, d, 792, 4);
  }
  store.free(b);
  EXPECT_TRUE(store.release(c, 1, nullptr));  // its last reference: freed
  EXPECT_EQ(folder.files(), 1u);
  EXPECT_EQ(store.spilled_bytes(), 400u);
  EXPECT_EQ(code_of([&] { store.load(b); }), ErrorCode::unknown_actor);
}

TEST(ObjectStore, AnObjectLargerThanTheBoundGoesStraightToDisk) {
  Folder folder;
  ObjectStore store(0, ObjectStoreOptions{1000, folder.path.string()});
  const auto small = put(store, 100, 1);
  const auto large = put(store, 5000, 2);
  EXPECT_EQ(store.memory_bytes(), 108u);  // the small one stays in memory
  EXPECT_EQ(store.spilled_bytes(), 5008u);
  expect_object(store, large, 5000, 2);
  expect_object(store, small, 100, 1);
}

TEST(ObjectStore, ItsFolderGoesWithIt) {
  Folder folder;
  {
    ObjectStore store(3, ObjectStoreOptions{100, folder.path.string()});
    put(store, 500, 1);
    EXPECT_EQ(folder.files(), 1u);
  }
  EXPECT_EQ(folder.files(), 0u);
  EXPECT_TRUE(fs::is_empty(folder.path)) << "the store's own folder is left behind";
}

TEST(ObjectStore, ADamagedOrMissingSpillFileIsAnErrorNeverAWrongValue) {
  Folder folder;
  ObjectStore store(0, ObjectStoreOptions{100, folder.path.string()});
  const auto id = put(store, 1000, 1);
  const fs::path file = folder.only_file();
  ASSERT_FALSE(file.empty());
  std::string what;
  fs::resize_file(file, fs::file_size(file) - 1);  // cut short
  EXPECT_EQ(code_of([&] { store.load(id); }, &what), ErrorCode::storage_failed);
  EXPECT_NE(what.find(file.string()), std::string::npos) << what;
  EXPECT_NE(what.find("not the object that was written"), std::string::npos) << what;
  {
    std::ofstream(file, std::ios::binary) << std::string(fs::file_size(file) + 1, 'x');  // overwritten
  }
  EXPECT_EQ(code_of([&] { store.load(id); }), ErrorCode::storage_failed);
  fs::remove(file);
  EXPECT_EQ(code_of([&] { store.load(id); }, &what), ErrorCode::storage_failed);
  EXPECT_NE(what.find("No such file"), std::string::npos) << what;
}

TEST(ObjectStore, AFolderThatCannotBeWrittenRefusesThePutAndLosesNothing) {
  Folder folder;
  fs::create_directories(folder.path);
  const fs::path not_a_folder = folder.path / "file";
  std::ofstream(not_a_folder) << "x";
  ObjectStore store(0, ObjectStoreOptions{1000, (not_a_folder / "spill").string()});
  const auto a = put(store, 592, 1);
  std::string what;
  EXPECT_EQ(code_of([&] { put(store, 592, 2); }, &what), ErrorCode::overloaded);
  EXPECT_NE(what.find("spill folder"), std::string::npos) << what;
  expect_object(store, a, 592, 1);  // the object it tried to move stays in memory
  EXPECT_EQ(store.memory_bytes(), 600u);
  EXPECT_EQ(store.spilled_bytes(), 0u);
}

TEST(ObjectStore, SpillingStopsShortOfFillingTheDisk) {
  Folder folder;
  ObjectStoreOptions options{100, folder.path.string()};
  options.max_disk_use = 0.0;  // any file system is past it
  ObjectStore store(0, options);
  std::string what;
  EXPECT_EQ(code_of([&] { put(store, 500, 1); }, &what), ErrorCode::overloaded);
  EXPECT_NE(what.find("would fill"), std::string::npos) << what;
  EXPECT_EQ(folder.files(), 0u);
}
