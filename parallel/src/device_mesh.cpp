#include "troupe/parallel/device_mesh.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>

#include "troupe/error.hpp"

namespace troupe::parallel {

namespace {

std::string text_of(const std::vector<MeshDim>& dims, const char* separator) {
  std::string out;
  for (const MeshDim& d : dims) {
    if (!out.empty()) out += separator;
    out += d.name + (separator[0] == ',' ? "=" : " ") + std::to_string(d.size);
  }
  return out.empty() ? "(no dimensions)" : out;
}

std::int64_t fingerprint(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<std::int64_t>(h);
}

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (unsigned char c : name)
    if (!std::isalnum(c) && c != '_') return false;
  return true;
}

// The same on every rank that passed the same dimensions: throws or resolves -1.
std::vector<MeshDim> resolved(std::vector<MeshDim> dims, int world_size) {
  const std::string given = text_of(dims, ",");
  TROUPE_CHECK(!dims.empty(), "device mesh: no dimensions; give at least one, e.g. dp=", world_size);
  long long known = 1;
  MeshDim* rest = nullptr;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    MeshDim& d = dims[i];
    TROUPE_CHECK(valid_name(d.name), "device mesh '", given, "': dimension ", i, " has the name '", d.name,
                 "'; names are letters, digits and '_'");
    for (std::size_t j = 0; j < i; ++j)
      TROUPE_CHECK(dims[j].name != d.name, "device mesh '", given, "': dimension '", d.name, "' appears twice");
    if (d.size == -1) {
      TROUPE_CHECK(rest == nullptr, "device mesh '", given, "': only one dimension may be -1 (the rest)");
      rest = &d;
      continue;
    }
    TROUPE_CHECK(d.size >= 1, "device mesh '", given, "': dimension '", d.name, "' has size ", d.size,
                 "; sizes are >= 1, or -1 for the rest");
    known *= d.size;
  }
  if (rest != nullptr) {
    TROUPE_CHECK(world_size % known == 0, "device mesh '", given, "': the other dimensions hold ", known,
                 " ranks, which does not divide the world's ", world_size);
    rest->size = static_cast<int>(world_size / known);
    known *= rest->size;
  }
  TROUPE_CHECK(known == world_size, "device mesh '", given, "' holds ", known, " ranks, but the world has ",
               world_size);
  return dims;
}

}  // namespace

std::vector<MeshDim> parse_mesh(std::string_view text) {
  std::vector<MeshDim> dims;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view item = text.substr(begin, end - begin);
    const std::size_t eq = item.find('=');
    TROUPE_CHECK(eq != std::string_view::npos && eq > 0 && eq + 1 < item.size(), "device mesh '", std::string(text),
                 "': '", std::string(item), "' is not name=size (e.g. dp=2, or dp=-1 for the rest)");
    MeshDim d{std::string(item.substr(0, eq)), 0};
    const std::string size(item.substr(eq + 1));
    std::size_t used = 0;
    try {
      d.size = std::stoi(size, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TROUPE_CHECK(used == size.size() && used > 0, "device mesh '", std::string(text), "': the size of '", d.name,
                 "' is '", size, "', not a number");
    dims.push_back(std::move(d));
    begin = end + 1;
  }
  return dims;
}

DeviceMesh::DeviceMesh(collectives::Communicator& world, std::vector<MeshDim> dims) : world_(world) {
  // Ranks that were given different meshes would split differently and hang or
  // mismatch in the splits: compare first, so every rank fails alike instead.
  const std::string given = text_of(dims, ",");
  std::vector<std::int64_t> mine{fingerprint(given)};
  std::vector<std::int64_t> all(static_cast<std::size_t>(world.size()));
  world.allgather(collectives::Buffer(mine), collectives::Buffer(all));
  std::string others;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != mine[0]) others += (others.empty() ? "" : ",") + std::to_string(r);
  TROUPE_CHECK(others.empty(), "device mesh: the ranks disagree on it; rank ", world.rank(), " has '", given,
               "', ranks ", others, " another");
  dims_ = resolved(std::move(dims), world.size());

  const std::size_t n = dims_.size();
  strides_.assign(n, 1);
  for (std::size_t d = n - 1; d > 0; --d) strides_[d - 1] = strides_[d] * dims_[d].size;
  for (std::size_t d = 0; d < n; ++d) coordinates_.push_back((world.rank() / strides_[d]) % dims_[d].size);
  // One split per dimension, in order, on every rank: the colour is the rank with this
  // dimension's coordinate zeroed (equal exactly for the ranks that differ only in it).
  for (std::size_t d = 0; d < n; ++d) {
    const int colour = world.rank() - coordinates_[d] * strides_[d];
    comms_.push_back(world.split(colour, coordinates_[d]));
    TROUPE_CHECK(comms_.back() != nullptr && comms_.back()->size() == dims_[d].size, "device mesh ", describe(),
                 ": the split for '", dims_[d].name, "' on rank ", world.rank(), " has ",
                 comms_.back() ? comms_.back()->size() : 0, " ranks, not ", dims_[d].size);
  }
}

DeviceMesh::~DeviceMesh() = default;

std::size_t DeviceMesh::index_of(std::string_view dim) const {
  for (std::size_t d = 0; d < dims_.size(); ++d)
    if (dims_[d].name == dim) return d;
  TROUPE_THROW(InvalidArgument, "device mesh ", describe(), " has no dimension '", std::string(dim), "'");
}

bool DeviceMesh::has(std::string_view dim) const {
  for (const MeshDim& d : dims_)
    if (d.name == dim) return true;
  return false;
}

int DeviceMesh::size(std::string_view dim) const { return dims_[index_of(dim)].size; }
int DeviceMesh::coordinate(std::string_view dim) const { return coordinates_[index_of(dim)]; }
collectives::Communicator& DeviceMesh::comm(std::string_view dim) const { return *comms_[index_of(dim)]; }

int DeviceMesh::rank_at(const std::vector<int>& coordinates) const {
  TROUPE_CHECK(coordinates.size() == dims_.size(), "device mesh ", describe(), ": ", coordinates.size(),
               " coordinates given for ", dims_.size(), " dimensions");
  int rank = 0;
  for (std::size_t d = 0; d < dims_.size(); ++d) {
    TROUPE_CHECK(coordinates[d] >= 0 && coordinates[d] < dims_[d].size, "device mesh ", describe(), ": coordinate ",
                 coordinates[d], " is outside '", dims_[d].name, "' of size ", dims_[d].size);
    rank += coordinates[d] * strides_[d];
  }
  return rank;
}

std::string DeviceMesh::describe() const { return text_of(dims_, " x "); }

}  // namespace troupe::parallel
