// RankAgreement: how the parallel save keeps every rank in step when something is wrong.
//
// Parallel HDF5 needs every rank to make the same calls with the same arguments; a rank
// that throws on its own while the others go on into a collective leaves them hanging.
// So nothing in the parallel writer throws alone. Each call starts with agree(): one
// allgather of (digest of the call's description, "I have a problem"), then, for a
// write, one of every rank's slice ranges. If any rank found a problem with its own arguments, or the descriptions
// differ, every rank throws the same InvalidArgument -- the first problem, or the first line where a rank's description
// differs from rank 0's, both versions quoted. Each step that calls HDF5 then runs under all_or_none(): a failure on
// any rank is learnt by all (an allreduce) and rethrown on every rank with the failing rank's message. The extra
// messages on the error path (the texts) are sent only once every rank knows it is on it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace troupe::checkpoint::detail {

// A rank's slice of a tensor: elements [begin, end) in flat C order.
struct ElementRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

class RankAgreement {
 public:
  // Uses `comm` (does not own it).
  explicit RankAgreement(MPI_Comm comm);
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Prefixes every message: "checkpoint /d/.ckpt-000000007.h5.tmp-12 (parallel save)".
  void set_context(std::string context) { context_ = std::move(context); }

  using Range = ElementRange;
  // Collective. `call` describes what this rank is about to do, one line per item;
  // `problem` is what is wrong with its own arguments ("" if nothing). Returns once all
  // agree; throws on every rank otherwise.
  void agree(const std::vector<std::string>& call, const std::string& problem);
  // The same for a call on tensors, with this rank's range of each (ranks may pass
  // different ranges, not different counts). Returns ranges[tensor][rank].
  std::vector<std::vector<Range>> agree(const std::vector<std::string>& call, const std::string& problem,
                                        const std::vector<Range>& ranges);

  // Collective. Runs `step`; if it threw on any rank, every rank throws the error of the
  // lowest such rank (InvalidArgument and FormatError keep their type, anything else
  // becomes CheckpointError).
  template <class F>
  void all_or_none(F&& step) {
    std::exception_ptr failure;
    try {
      step();
    } catch (...) {
      failure = std::current_exception();
    }
    settle(failure);
  }
  void settle(std::exception_ptr local);

  // Collective: `text` as rank `root` has it.
  std::string broadcast(std::string text, int root) const;
  // Throws, on the calling rank, the kind of error settle() relays, with the context.
  [[noreturn]] void fail(int kind, const std::string& message) const;

  enum Kind : int { kNone = 0, kInvalidArgument = 1, kFormat = 2, kOther = 3 };

 private:
  // The lowest rank whose `kind` is not kNone, with its message: every rank gets it.
  // Returns false when no rank failed.
  bool first_failure(int kind, const std::string& message, int* failed_rank, int* failed_kind,
                     std::string* failed_message) const;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::string context_ = "checkpoint (parallel save)";
};

}  // namespace troupe::checkpoint::detail
