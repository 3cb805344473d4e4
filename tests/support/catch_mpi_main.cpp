// Catch2 main for tests that use the runtime: every rank runs the same test cases (so
// collectives inside them match up) and the process exits non-zero on EVERY rank when any
// rank had a failure, so mpirun and CTest see it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <mpi.h>

#include "tarantella/runtime.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  tnt::init(&argc, &argv);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  int failed = rc != 0 ? 1 : session.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && !failed) {
    std::fprintf(stderr, "rank %d: passed, but another rank failed\n", tnt::rank());
  }
  tnt::finalize();
  return any_failed ? 1 : 0;
}
