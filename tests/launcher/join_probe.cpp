// A program of the runtime for the launcher's tests: `tnt_join_probe LEAVE` exits 0 on
// rank LEAVE before tnt::init (a program that ends before it joins the job), and on every
// other rank joins the job (MPI_Init waits there for every rank) and ends.
// `tnt_join_probe throw-int RANK`: inside tnt::run_main, rank RANK throws an int (not a
// std::exception) and the others wait in a collective.
#include <tarantella/comm.hpp>
#include <tarantella/runtime.hpp>

#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  const char* rank = std::getenv("TNT_RANK");
  if (argc > 2 && std::strcmp(argv[1], "throw-int") == 0) {
    const int thrower = std::atoi(argv[2]);
    return tnt::run_main(argc, argv, [&] {
      if (tnt::rank() == thrower) throw 42;
      tnt::communicator().allreduce_sum(1.0);
    });
  }
  if (argc > 1 && rank != nullptr && std::strcmp(argv[1], rank) == 0) return 0;
  tnt::init(&argc, &argv);
  tnt::finalize();
  return 0;
}
