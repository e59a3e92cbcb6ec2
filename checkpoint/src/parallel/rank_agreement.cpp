#include "rank_agreement.hpp"

#include <algorithm>
#include <numeric>

#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/xxhash64.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::checkpoint::detail {

namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out.append(line).push_back('\n');
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

int kind_of(std::exception_ptr failure, std::string* message) {
  try {
    std::rethrow_exception(failure);
  } catch (const InvalidArgument& e) {
    *message = e.what();
    return RankAgreement::kInvalidArgument;
  } catch (const FormatError& e) {
    *message = e.what();
    return RankAgreement::kFormat;
  } catch (const std::exception& e) {
    *message = e.what();
  } catch (...) {
    *message = "unknown exception";
  }
  return RankAgreement::kOther;
}

}  // namespace

RankAgreement::RankAgreement(MPI_Comm comm) : comm_(comm) {
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  TROUPE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

std::string RankAgreement::broadcast(std::string text, int root) const {
  std::uint64_t length = text.size();
  TROUPE_MPI_CHECK(MPI_Bcast(&length, 1, MPI_UINT64_T, root, comm_));
  text.resize(length);
  if (length) TROUPE_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, root, comm_));
  return text;
}

void RankAgreement::fail(int kind, const std::string& message) const {
  std::string text = context_ + ": " + message;
  if (kind == kInvalidArgument) throw InvalidArgument(text);
  if (kind == kFormat) throw FormatError(text);
  throw CheckpointError(text);
}

bool RankAgreement::first_failure(int kind, const std::string& message, int* failed_rank, int* failed_kind,
                                  std::string* failed_message) const {
  int mine = kind == kNone ? size_ : rank_;
  TROUPE_MPI_CHECK(MPI_Allreduce(&mine, failed_rank, 1, MPI_INT, MPI_MIN, comm_));
  if (*failed_rank == size_) return false;
  *failed_kind = kind;
  TROUPE_MPI_CHECK(MPI_Bcast(failed_kind, 1, MPI_INT, *failed_rank, comm_));
  *failed_message = broadcast(message, *failed_rank);
  return true;
}

void RankAgreement::settle(std::exception_ptr local) {
  std::string message;
  int kind = local ? kind_of(local, &message) : kNone;
  int failed_rank = 0, failed_kind = kNone;
  std::string failed_message;
  if (first_failure(kind, message, &failed_rank, &failed_kind, &failed_message))
    fail(failed_kind,
         "rank " + std::to_string(failed_rank) + " of " + std::to_string(size_) + " failed: " + failed_message);
}

void RankAgreement::agree(const std::vector<std::string>& call, const std::string& problem) {
  agree(call, problem, std::vector<Range>{});
}

std::vector<std::vector<RankAgreement::Range>> RankAgreement::agree(const std::vector<std::string>& call,
                                                                    const std::string& problem,
                                                                    const std::vector<Range>& ranges) {
  // First, per rank: the call's digest, "I have a problem", the number of ranges. The
  // ranges follow in a second allgather, once every rank is known to send as many.
  std::string text = joined(call);
  const std::int64_t mine[3] = {static_cast<std::int64_t>(xxh64(text.data(), text.size())), problem.empty() ? 0 : 1,
                                static_cast<std::int64_t>(ranges.size())};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(size_));
  TROUPE_MPI_CHECK(MPI_Allgather(mine, 3, MPI_INT64_T, all.data(), 3, MPI_INT64_T, comm_));
  auto at = [&](int r, std::size_t k) { return all[3 * static_cast<std::size_t>(r) + k]; };

  // 1. A rank's own arguments are wrong: its message, on every rank.
  for (int r = 0; r < size_; ++r)
    if (at(r, 1)) {
      std::string message = broadcast(problem, r);
      fail(kInvalidArgument, "rank " + std::to_string(r) + " of " + std::to_string(size_) + ": " + message);
    }

  // 2. Ranks disagree on the call: quote the first line where one differs from rank 0.
  bool same = true;
  for (int r = 1; r < size_; ++r) same = same && at(r, 0) == at(0, 0) && at(r, 2) == at(0, 2);
  if (!same) {
    std::vector<std::string> theirs = split_lines(broadcast(text, 0));
    std::string difference;
    if (theirs != call) {
      std::size_t line = 0;
      while (line < theirs.size() && line < call.size() && theirs[line] == call[line]) ++line;
      auto quote = [](const std::vector<std::string>& lines, std::size_t i) {
        return i < lines.size() ? "'" + lines[i] + "'" : std::string("nothing more");
      };
      difference = "rank 0 has " + quote(theirs, line) + ", rank " + std::to_string(rank_) + " has " +
                   quote(call, line) + " (line " + std::to_string(line + 1) + " of the call)";
    }
    int failed_rank = 0, failed_kind = kNone;
    std::string failed_message;
    if (!first_failure(difference.empty() ? kNone : kInvalidArgument, difference, &failed_rank, &failed_kind,
                       &failed_message))
      failed_message = "their calls' digests differ";  // a digest collision the other way: cannot happen
    fail(kInvalidArgument, "ranks disagree on what to write: " + failed_message +
                               "; every rank must make the same calls with the same arguments");
  }

  const std::size_t width = 2 * ranges.size();
  std::vector<std::int64_t> flat, every(width * static_cast<std::size_t>(size_));
  for (const Range& r : ranges) flat.insert(flat.end(), {r.begin, r.end});
  if (width > 0)
    TROUPE_MPI_CHECK(MPI_Allgather(flat.data(), static_cast<int>(width), MPI_INT64_T, every.data(),
                                   static_cast<int>(width), MPI_INT64_T, comm_));
  std::vector<std::vector<Range>> out(ranges.size(), std::vector<Range>(static_cast<std::size_t>(size_)));
  for (std::size_t t = 0; t < ranges.size(); ++t)
    for (std::size_t r = 0; r < static_cast<std::size_t>(size_); ++r)
      out[t][r] = {every[width * r + 2 * t], every[width * r + 2 * t + 1]};
  return out;
}

}  // namespace troupe::checkpoint::detail
