// Driver-side helpers for a group of TrainWorkers (train_worker.hpp), on rank 0.
#pragma once

#include "troupe/actors/actor_ref.hpp"
#include "troupe/actors/future.hpp"
#include "troupe/error.hpp"
#include "troupe/train/worker_options.hpp"

namespace troupe::train {

// For the driver: every worker restores the newest valid checkpoint, and all must agree
// on the step and the parameters (a rank that read another file is an Error).
template <class Worker>
WorkerState resume_workers(const actors::ActorGroup<Worker>& workers) {
  const auto resumed = actors::when_all(workers.ask(&Worker::resume)).get();
  for (const auto& r : resumed)
    if (r.step != resumed[0].step || r.parameter_hash != resumed[0].parameter_hash)
      TROUPE_THROW(Error, "rank ", r.rank, " resumed at step ", r.step, ", rank 0 at step ", resumed[0].step);
  return resumed[0];
}

// Runs `drive` (the driver, rank 0 only) and then stops every worker, also when it
// throws, so no rank is left waiting in a collective. Returns drive's result (0 on
// other ranks).
template <class Worker, class Drive>
int drive_then_stop(const actors::ActorGroup<Worker>& workers, int rank, Drive drive) {
  if (rank != 0) return 0;
  int status = 0;
  try {
    status = drive();
  } catch (...) {
    try {
      actors::when_all(workers.ask(&Worker::stop)).get();
    } catch (const std::exception&) {  // a consequence (the last save failed too): the first error says why
    }
    throw;
  }
  actors::when_all(workers.ask(&Worker::stop)).get();
  return status;
}

}  // namespace troupe::train
