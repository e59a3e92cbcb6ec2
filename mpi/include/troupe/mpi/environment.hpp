// MPI's lifetime for a process: initialises MPI with MPI_THREAD_MULTIPLE (troupe's
// progress threads and callers use MPI concurrently) and finalises it once, when
// the Environment that initialised it goes away. A second Environment in the same
// process (a test fixture and a Runtime, say) shares the first one's MPI.
//
// MPI cannot be initialised again after MPI_Finalize; constructing an Environment
// after that throws MpiError rather than aborting inside MPI.
#pragma once

namespace troupe::mpi {

class Environment {
 public:
  Environment(int* argc, char*** argv);
  Environment() : Environment(nullptr, nullptr) {}
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  ~Environment();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Whether this object called MPI_Init_thread (and so will call MPI_Finalize).
  bool owns_mpi() const { return owns_; }

 private:
  bool owns_ = false;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace troupe::mpi
