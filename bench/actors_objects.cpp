// actors_bench --objects: moving a 64 MB value between actors through an ObjectRef,
// next to raw MPI and to the driver fetching and resending it (issue 52).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "actors_bench_rows.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/peak_rss.hpp"

namespace actors_bench {

namespace {

// For --objects: holds a ready 64 MB value (make() shares it: what is timed is moving it).
struct Holder {
  explicit Holder(int mb) : value(std::vector<std::byte>(static_cast<std::size_t>(mb) << 20, std::byte{3})) {}
  troupe::Bytes make() { return value; }  // shares the buffer: the cost is the transfer
  long long take(troupe::Bytes b) { return static_cast<long long>(b.size()); }
  long long take_ref(troupe::ObjectRef<troupe::Bytes> r) { return static_cast<long long>(r.get().size()); }
  troupe::Bytes value;
  static constexpr auto troupe_methods = troupe::methods<&Holder::make, &Holder::take, &Holder::take_ref>;
};

}  // namespace

// 64 MB from the actor on rank 1 to the one on rank 2, driven by rank 0: through an
// ObjectRef (rank 2 fetches from rank 1) and fetched by the driver and sent on, next
// to one raw MPI transfer from rank 1 to rank 2 started and acknowledged by rank 0 in
// the same job; with the driver's peak memory growth on both actor paths.
int objects_bench(troupe::Runtime& rt, bool quick, const std::string& json) {
  if (rt.size() != 3) {
    if (rt.rank() == 0) std::fprintf(stderr, "actors_bench --objects: run it on 3 ranks (mpirun -np 3)\n");
    return 2;
  }
  constexpr int kMb = 64;
  const int rounds = quick ? 2 : 7;
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  // Each round: the raw transfer, then the two actor paths (rank 0 drives; ranks 1 and 2
  // serve from their runtimes' threads while their main threads wait in the barrier),
  // so a slow spell of this machine falls on both sides alike.
  troupe::ActorRef<Holder> a, b;
  if (rt.rank() == 0) {
    a = rt.spawn<Holder>(1, kMb);
    b = rt.spawn<Holder>(2, kMb);
  }
  std::vector<double> direct, via_ref, resend;
  double ref_growth = 0, resend_growth = 0;
  const int n = kMb << 20;
  std::vector<std::byte> buffer(rt.rank() == 0 ? 0 : static_cast<std::size_t>(n), std::byte{3});  // the raw one's
  for (int r = 0; r < rounds; ++r) {
    quiet_barrier(raw);
    char token = 0;
    if (rt.rank() == 0) {
      const auto start = Clock::now();
      MPI_Send(&token, 1, MPI_CHAR, 1, 0, raw);
      MPI_Recv(&token, 1, MPI_CHAR, 2, 0, raw, MPI_STATUS_IGNORE);
      direct.push_back(seconds_since(start) * 1e3);
    } else if (rt.rank() == 1) {
      MPI_Recv(&token, 1, MPI_CHAR, 0, 0, raw, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), n, MPI_BYTE, 2, 0, raw);
    } else {
      MPI_Recv(buffer.data(), n, MPI_BYTE, 1, 0, raw, MPI_STATUS_IGNORE);
      MPI_Send(&token, 1, MPI_CHAR, 0, 0, raw);
    }
    quiet_barrier(raw);
    if (rt.rank() != 0) continue;
    troupe::reset_peak_rss();
    const auto rss = troupe::proc_status_bytes("VmRSS:");
    auto start = Clock::now();
    auto ref = a.ask_ref(&Holder::make).get();
    b.ask(&Holder::take_ref, ref).get();
    via_ref.push_back(seconds_since(start) * 1e3);
    ref.free();
    ref_growth = std::max(ref_growth, static_cast<double>(troupe::proc_status_bytes("VmHWM:") - rss) / 1e6);
    troupe::reset_peak_rss();
    const auto rss2 = troupe::proc_status_bytes("VmRSS:");
    start = Clock::now();
    {
      const troupe::Bytes value = a.ask(&Holder::make).get();
      b.ask(&Holder::take, value).get();
    }
    resend.push_back(seconds_since(start) * 1e3);
    resend_growth = std::max(resend_growth, static_cast<double>(troupe::proc_status_bytes("VmHWM:") - rss2) / 1e6);
  }
  quiet_barrier(raw);
  std::vector<Row> rows;
  if (rt.rank() == 0) {
    const double d = median(direct), v = median(via_ref), s = median(resend);
    rows.push_back({"64 MB from A to B through an ObjectRef (3 ranks, shm)", "ms", "lower", v, d,
                    "one raw MPI transfer A to B, started and acknowledged by the driver", "<= 1.1x direct",
                    v <= 1.1 * d});
    rows.push_back({"64 MB from A to B fetched by the driver and sent on (3 ranks, shm)", "ms", "lower", s, d,
                    "one raw MPI transfer A to B, started and acknowledged by the driver", "", -1});
    rows.push_back({"driver's peak memory growth, ObjectRef path (3 ranks)", "MB", "lower", ref_growth, resend_growth,
                    "the fetch-and-resend path", "< 1 MB", ref_growth < 1.0});
    std::printf("%-68s %10s %10s %7s  %s\n", "case", "troupe", "baseline", "ratio", "target");
    for (const Row& row : rows)
      std::printf("%-68s %10.2f %10.2f %7.2f  %s\n", row.name.c_str(), row.ours, row.theirs,
                  row.theirs > 0 ? row.ours / row.theirs : 0.0, row.target.c_str());
    if (!json.empty()) write_json(json, rows);
  }
  MPI_Comm_free(&raw);
  rt.shutdown();
  return 0;
}

}  // namespace actors_bench
