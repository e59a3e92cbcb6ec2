#include "troupe/checkpoint/checkpoint_actor.hpp"

#include <iterator>

#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/error.hpp"

namespace troupe::checkpoint {

namespace fs = std::filesystem;

CheckpointActor::CheckpointActor(std::string folder, std::int64_t keep_last)
    : dir_(std::move(folder), static_cast<std::size_t>(keep_last)) {}

CheckpointActor::~CheckpointActor() { drop_open(); }

void CheckpointActor::drop_open() {
  if (!open_) return;
  fs::path temp = open_->temp;
  open_.reset();  // closes the writer (incomplete) first
  std::error_code ec;
  fs::remove(temp, ec);
}

void CheckpointActor::begin(SaveManifest manifest) {
  if (open_ && open_->manifest.step == manifest.step) {
    if (!(open_->manifest == manifest))
      TROUPE_THROW(InvalidArgument, "checkpoint actor: ranks disagree on the manifest of step ", manifest.step, " (",
                   open_->manifest.tensors.size(), " vs ", manifest.tensors.size(), " tensors)");
    return;  // another rank's begin for the save already open
  }
  drop_open();
  dir_.wait_for_removals();  // the last commit's, before the folder takes a new file
  Open open;
  open.temp = dir_.temp_path(manifest.step);
  open.file = std::make_unique<FileWriter>(open.temp.string());
  FileWriter& f = *open.file;
  f.set_attribute("/", "step", manifest.step);
  f.set_attribute("/", "epoch", manifest.epoch);
  f.set_attribute("/", "world_size", manifest.world_size);
  f.set_attribute("/", "created_utc", utc_now_iso8601());
  f.set_attribute("/", "run_id", manifest.run_id);
  f.set_attribute("/", "config", manifest.config_json);
  for (const std::string& g : manifest.groups) f.ensure_group(g);
  for (const TensorSpec& t : manifest.tensors) f.create_dataset(t.path, tensor::dtype_from_name(t.dtype), t.shape);
  for (const AttributeSpec& a : manifest.attributes) f.set_attribute(a.group, a.name, a.value);
  open.written.assign(manifest.tensors.size(), {});
  open.manifest = std::move(manifest);
  open_ = std::move(open);
}

CheckpointActor::Open& CheckpointActor::open_for(std::int64_t step, const char* what) {
  if (!open_ || open_->manifest.step != step)
    TROUPE_THROW(InvalidArgument, "checkpoint actor: ", what, " for step ", step, " but ",
                 open_ ? "the open save is step " + std::to_string(open_->manifest.step)
                       : std::string("no save is open (begin first)"));
  return *open_;
}

void CheckpointActor::piece(std::int64_t step, std::int64_t index, std::int64_t byte_offset, std::int64_t from_rank,
                            actors::Bytes data) {
  Open& open = open_for(step, "piece");
  const auto refuse = [&](const std::string& why) {
    const std::string message = "checkpoint actor, " + open.temp.string() + ": step " + std::to_string(step) +
                                ", a piece from rank " + std::to_string(from_rank) + " " + why +
                                "; the save is abandoned, the previous checkpoint stays latest";
    if (open.refused.empty()) open.refused = message;
    TROUPE_THROW(CheckpointError, message);
  };
  if (!open.refused.empty()) refuse("arrived after an earlier piece was refused");
  if (index < 0 || index >= static_cast<std::int64_t>(open.manifest.tensors.size()))
    refuse("names tensor index " + std::to_string(index) + " of " + std::to_string(open.manifest.tensors.size()));
  const TensorSpec& spec = open.manifest.tensors[static_cast<std::size_t>(index)];
  const auto element = static_cast<std::int64_t>(tensor::element_size(tensor::dtype_from_name(spec.dtype)));
  const std::int64_t total = tensor::shape_numel(spec.shape) * element;
  const std::int64_t begin = byte_offset, end = byte_offset + static_cast<std::int64_t>(data.size());
  const std::string range = "bytes [" + std::to_string(begin) + ", " + std::to_string(end) + ") of tensor " + spec.path;
  if (begin < 0) refuse("starts at a negative offset: " + range);
  if (end > total) refuse("runs past the tensor's " + std::to_string(total) + " bytes: " + range);
  if (begin % element != 0 || (end - begin) % element != 0)
    refuse("is not whole " + std::to_string(element) + "-byte elements: " + range);
  auto& written = open.written[static_cast<std::size_t>(index)];
  // The first written range ending after `begin` is the only one that can overlap it.
  auto next = written.upper_bound(begin);
  if (next != written.begin() && std::prev(next)->second > begin) next = std::prev(next);
  if (next != written.end() && next->first < end)
    refuse("overlaps bytes [" + std::to_string(next->first) + ", " + std::to_string(next->second) +
           ") already written (a piece sent twice?): " + range);
  if (begin == end) return;
  open.file->write_range(spec.path, static_cast<std::size_t>(begin), data.data(), data.size());
  // Merged with its neighbours, so a complete tensor is one range.
  std::int64_t lo = begin, hi = end;
  if (auto after = written.find(end); after != written.end()) {
    hi = after->second;
    written.erase(after);
  }
  if (auto before = written.lower_bound(begin); before != written.begin() && std::prev(before)->second == begin) {
    lo = std::prev(before)->first;
    written.erase(std::prev(before));
  }
  written[lo] = hi;
}

std::string CheckpointActor::commit(std::int64_t step) {
  Open& open = open_for(step, "commit");
  if (!open.refused.empty()) {
    const std::string why = open.refused;
    drop_open();
    TROUPE_THROW(CheckpointError, why);
  }
  for (std::size_t i = 0; i < open.manifest.tensors.size(); ++i) {
    const TensorSpec& spec = open.manifest.tensors[i];
    const std::int64_t total = tensor::shape_numel(spec.shape) *
                               static_cast<std::int64_t>(tensor::element_size(tensor::dtype_from_name(spec.dtype)));
    const auto& written = open.written[i];
    if (total == 0 || (written.size() == 1 && written.begin()->first == 0 && written.begin()->second == total))
      continue;
    // The first gap: before the first range, or after the first range that stops short.
    std::int64_t gap = 0, gap_end = total;
    if (!written.empty() && written.begin()->first == 0) {
      gap = written.begin()->second;
      gap_end = std::next(written.begin()) != written.end() ? std::next(written.begin())->first : total;
    } else if (!written.empty()) {
      gap_end = written.begin()->first;
    }
    std::int64_t covered = 0;
    for (const auto& [b, e] : written) covered += e - b;
    const std::string message = "checkpoint actor, " + open.temp.string() + ": step " + std::to_string(step) +
                                ", tensor " + spec.path + " has " + std::to_string(covered) + " of " +
                                std::to_string(total) + " bytes written; bytes [" + std::to_string(gap) + ", " +
                                std::to_string(gap_end) +
                                ") were never sent (a rank's piece is missing); the save is abandoned";
    drop_open();  // destroys the manifest
    TROUPE_THROW(CheckpointError, message);
  }
  try {
    for (const TensorSpec& spec : open.manifest.tensors) open.file->finish_dataset(spec.path);
    open.file->close();
    fs::path final = dir_.commit(open.temp, step);
    open_.reset();
    return final.string();
  } catch (...) {
    drop_open();
    throw;
  }
}

void CheckpointActor::discard(std::int64_t step) {
  if (open_ && open_->manifest.step == step) drop_open();
}

void CheckpointActor::wait_for_removals() { dir_.wait_for_removals(); }

actors::Future<void> send_piece(const actors::ActorRef<CheckpointActor>& actor, std::int64_t step, std::int64_t index,
                                std::int64_t elem_offset, const tensor::Tensor& piece, std::int64_t from_rank) {
  tensor::Tensor host = piece.device().is_cpu() ? piece : piece.to(tensor::Device::cpu());
  // A view of the tensor's own storage: the attachment is sent from it without a copy.
  actors::Bytes bytes(std::shared_ptr<const void>(host.storage(), host.raw_data()),
                      static_cast<const std::byte*>(host.raw_data()), host.nbytes());
  return actor.ask(&CheckpointActor::piece, step, index, elem_offset * static_cast<std::int64_t>(host.element_bytes()),
                   from_rank, bytes);
}

}  // namespace troupe::checkpoint
