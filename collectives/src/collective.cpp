#include "troupe/collectives/collective.hpp"

#include "troupe/error.hpp"

namespace troupe::collectives {

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::reduce: return "reduce";
    case CollectiveKind::allgather: return "allgather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::gather: return "gather";
    case CollectiveKind::scatter: return "scatter";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
  }
  return "unknown-collective";
}

std::string Collective::describe() const {
  std::string text = troupe::detail::concat(collective_name(kind), is_point_to_point() ? " p2p#" : " #", sequence);
  if (kind == CollectiveKind::barrier) return text;
  text += troupe::detail::concat(" (");
  if (has_op()) text += troupe::detail::concat(reduce_op_name(op), ", ");
  if (has_root()) text += troupe::detail::concat("root ", root, ", ");
  if (is_point_to_point())
    text += troupe::detail::concat(kind == CollectiveKind::send ? "to " : "from ", root, " tag ", tag, ", ");
  text += troupe::detail::concat(count, " x ", tensor::dtype_name(dtype), " = ", count * tensor::element_size(dtype),
                                 " B)");
  return text;
}

}  // namespace troupe::collectives
