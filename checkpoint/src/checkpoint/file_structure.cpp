// FileReader's walk of a file's structure: each link looked up before it is followed,
// hard links only, every object reached once, groups nested a bounded depth, every
// dataset's sizes checked against what the file stores (docs/CHECKPOINT_FORMAT.md,
// "What makes a file valid").
#include <optional>

#include "file_reader_impl.hpp"
#include "h5_layout.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/format.hpp"

namespace troupe::checkpoint {

using detail::Failure;
using detail::h5_check;
using detail::Handle;
using detail::Link;
using detail::LinkList;
using detail::Object;

namespace detail {
namespace {

std::string join(const std::string& group, const std::string& name) {
  return group == "/" ? "/" + name : group + "/" + name;
}

// Installed on every link access list the reader uses: an external link names another
// file, which HDF5 would open to follow it (a FIFO there blocks forever, a device or a
// network path worse). The reader refuses such links before following any; this makes
// sure one it did not see cannot open a file either.
herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) { return -1; }

}  // namespace

Handle link_access(hid_t list_class) {
  Handle list(h5_check(H5Pcreate(list_class), "H5Pcreate(link access)"), H5Pclose);
  h5_check(H5Pset_elink_cb(list.get(), refuse_external_link, nullptr), "H5Pset_elink_cb");
  h5_check(H5Pset_nlinks(list.get(), 1), "H5Pset_nlinks");
  return list;
}

namespace {

std::string link_kind(H5L_type_t type) {
  if (type == H5L_TYPE_SOFT) return "a soft link";
  if (type == H5L_TYPE_EXTERNAL) return "an external link";
  return "a user-defined link (type " + std::to_string(static_cast<int>(type)) + ")";
}

// Groups nest this deep at most: troupe's are /section/name/slot, a few levels. A crafted
// file can nest thousands (each a few hundred bytes), which costs a walk its stack.
constexpr int kMaxDepth = 64;

// A name no HDF5 writer makes, which a path would read as something else: "" or "."
// (the group itself), or one holding a '/' (a path through other links).
bool is_path_like(std::string_view name) {
  return name.empty() || name == "." || name.find('/') != std::string_view::npos;
}

// H5Literate's callback. Nothing may throw through HDF5's C frames, so a link to refuse
// is recorded and the iteration stopped (1); the caller throws.
herr_t collect_link(hid_t group, const char* name, const H5L_info_t* link, void* data) {
  auto* list = static_cast<LinkList*>(data);
  // Looking at a soft or external link's object would follow it: only its kind is read.
  if (link->type != H5L_TYPE_HARD || is_path_like(name)) {
    list->refused = name;
    list->why = link->type != H5L_TYPE_HARD
                    ? link_kind(link->type) + "; troupe writes hard links only, and a reader follows no other kind"
                    : "a link name HDF5 would read as a path";
    return 1;
  }
  H5O_info_t info;
  if (H5Oget_info_by_name2(group, name, &info, H5O_INFO_BASIC, list->lapl) < 0) return -1;
  list->links.push_back({name, info.type, link->u.address});
  return 0;
}

}  // namespace
}  // namespace detail

using detail::collect_link;
using detail::join;
using detail::kMaxDepth;
using detail::link_kind;

// Whether `object` (a path from the caller) exists, reached through hard links only:
// each part is looked up in turn, so none is followed before it is known to be a hard
// link. A part that is any other link is a FormatError naming it.
bool FileReader::Impl::through_hard_links(const std::string& object) const {
  if (object == "/") return true;
  for (std::size_t end = object.find('/', 1);; end = object.find('/', end + 1)) {
    const std::string part = object.substr(0, end);
    H5L_info_t link;
    if (H5Lget_info(file.get(), part.c_str(), &link, lapl.get()) < 0) {
      detail::fail_if_storage_error("checkpoint " + at(part) + ": cannot look the link up");
      return false;
    }
    if (link.type != H5L_TYPE_HARD)
      TROUPE_THROW(FormatError, "checkpoint ", at(part), ": ", link_kind(link.type),
                   "; troupe writes hard links only, and a reader follows no other kind");
    if (end == std::string::npos) return true;
  }
}

// The hard links of a group in creation order (name order for files that do not track
// it). Which one is the group's own property: falling back to name order when the
// creation order fails would list a damaged group's surviving links as if they were all.
// Any other link, and a name a path would misread (is_path_like), is a FormatError.
detail::LinkList FileReader::Impl::links(const std::string& group) const {
  const std::string where = at(group);
  Handle g(h5_check(H5Oopen(file.get(), group.c_str(), lapl.get()), "H5Oopen " + where, Failure::format), H5Oclose);
  if (H5Iget_type(g.get()) != H5I_GROUP) TROUPE_THROW(FormatError, "checkpoint ", where, ": not a group");
  Handle gcpl(h5_check(H5Gget_create_plist(g.get()), "H5Gget_create_plist " + where, Failure::format), H5Pclose);
  unsigned order = 0;
  h5_check(H5Pget_link_creation_order(gcpl.get(), &order), "H5Pget_link_creation_order " + where, Failure::format);
  LinkList out;
  out.lapl = lapl.get();
  hsize_t idx = 0;
  h5_check(H5Literate(g.get(), (order & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME, H5_ITER_INC, &idx,
                      collect_link, &out),
           "checkpoint " + where + ": cannot list the group's links (damaged?)", Failure::format);
  if (!out.refused.empty())
    TROUPE_THROW(FormatError, "checkpoint ", where, (group == "/" ? "" : "/"), printable(out.refused), ": ", out.why);
  return out;
}

// Every group and dataset below `root`, depth first in creation order. Each object must be
// reached by one link only: a second one is a cycle (a group linking to itself or an
// ancestor: the walk would never end) or a shared object (listed twice; a chain of groups
// each linking twice to the next lists 2^depth paths from a few KB). troupe links every
// object once, so either is refused, naming both paths.
std::vector<detail::Object> FileReader::Impl::walk(const std::string& root) const {
  H5O_info_t info;
  h5_check(H5Oget_info_by_name2(file.get(), root.c_str(), &info, H5O_INFO_BASIC, lapl.get()), "H5Oget_info " + at(root),
           Failure::format);
  std::unordered_map<haddr_t, std::string> seen{{info.addr, root}};
  std::vector<Object> out;
  walk(root, 0, seen, out);
  return out;
}

void FileReader::Impl::walk(const std::string& group, int depth, std::unordered_map<haddr_t, std::string>& seen,
                            std::vector<detail::Object>& out) const {
  if (depth >= kMaxDepth)
    TROUPE_THROW(FormatError, "checkpoint ", at(group), ": groups nested more than ", kMaxDepth, " deep");
  for (Link& link : links(group).links) {
    std::string child = join(group, link.name);
    const auto [first, fresh] = seen.emplace(link.addr, child);
    if (!fresh)
      TROUPE_THROW(FormatError, "checkpoint ", at(child), ": a second link to the object first reached as ",
                   printable(first->second),
                   " (a link cycle, or an object shared by two groups; troupe links every object once)");
    out.push_back({child, link.type});
    if (link.type == H5O_TYPE_GROUP) walk(child, depth + 1, seen, out);
  }
}

// What a dataset holds, every size checked against what the file stores before a caller
// allocates or reads by it (detail::checked_extent, detail::check_storage).
TensorInfo FileReader::Impl::describe(const std::string& dataset) const {
  TensorInfo out;
  out.path = dataset;
  const std::string where = at(dataset);
  Handle dset(h5_check(H5Dopen2(file.get(), dataset.c_str(), dapl.get()),
                       "checkpoint " + where + ": cannot open the dataset", Failure::format),
              H5Dclose);
  out.dtype = detail::dtype_of_dataset(dset.get(), where, strings);
  const detail::Extent extent = detail::checked_extent(dset.get(), tensor::element_size(out.dtype), where);
  detail::check_storage(dset.get(), extent, file_size, where);
  out.shape = extent.shape;
  std::optional<std::uint64_t> sum = detail::read_u64_attribute(dset.get(), kAttrChecksum, where, strings);
  if (!sum) TROUPE_THROW(FormatError, "checkpoint ", where, ": no ", kAttrChecksum, " attribute");
  out.checksum = *sum;
  return out;
}

}  // namespace troupe::checkpoint
