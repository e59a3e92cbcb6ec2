#include "troupe/checkpoint/checkpoint_actor.hpp"

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
      TROUPE_THROW(InvalidArgument, "checkpoint actor: ranks disagree on the manifest of step ", manifest.step,
                   " (", open_->manifest.tensors.size(), " vs ", manifest.tensors.size(), " tensors)");
    return;  // another rank's begin for the save already open
  }
  drop_open();
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
  open.received.assign(manifest.tensors.size(), 0);
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

void CheckpointActor::piece(std::int64_t step, std::int64_t index, std::int64_t byte_offset, actors::Bytes data) {
  Open& open = open_for(step, "piece");
  TROUPE_CHECK(index >= 0 && index < static_cast<std::int64_t>(open.manifest.tensors.size()),
               "checkpoint actor: piece for tensor index ", index, " of ", open.manifest.tensors.size());
  const TensorSpec& spec = open.manifest.tensors[static_cast<std::size_t>(index)];
  open.file->write_range(spec.path, static_cast<std::size_t>(byte_offset), data.data(), data.size());
  open.received[static_cast<std::size_t>(index)] += static_cast<std::int64_t>(data.size());
}

std::string CheckpointActor::commit(std::int64_t step) {
  Open& open = open_for(step, "commit");
  for (std::size_t i = 0; i < open.manifest.tensors.size(); ++i) {
    const TensorSpec& spec = open.manifest.tensors[i];
    std::int64_t expected = tensor::shape_numel(spec.shape) *
                            static_cast<std::int64_t>(tensor::element_size(tensor::dtype_from_name(spec.dtype)));
    if (open.received[i] != expected) {
      std::int64_t got = open.received[i];
      std::string path = spec.path;  // drop_open() destroys the manifest
      drop_open();
      TROUPE_THROW(CheckpointError, "checkpoint actor: step ", step, " tensor ", path, " received ", got,
                   " of ", expected, " bytes (a piece is missing or sent twice); the save is abandoned");
    }
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

actors::Future<void> send_piece(const actors::ActorRef<CheckpointActor>& actor, std::int64_t step,
                                std::int64_t index, std::int64_t elem_offset, const tensor::Tensor& piece) {
  tensor::Tensor host = piece.device().is_cpu() ? piece : piece.to(tensor::Device::cpu());
  // A view of the tensor's own storage: the attachment is sent from it without a copy.
  actors::Bytes bytes(std::shared_ptr<const void>(host.storage(), host.raw_data()),
                      static_cast<const std::byte*>(host.raw_data()), host.nbytes());
  return actor.ask(&CheckpointActor::piece, step, index,
                   elem_offset * static_cast<std::int64_t>(host.element_bytes()), bytes);
}

}  // namespace troupe::checkpoint
