// A program of the runtime for the launcher's tests: `tnt_join_probe LEAVE` exits 0 on
// rank LEAVE before tnt::init (a program that ends before it joins the job), and on every
// other rank joins the job (MPI_Init waits there for every rank) and ends.
#include <tarantella/runtime.hpp>

#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  const char* rank = std::getenv("TNT_RANK");
  if (argc > 1 && rank != nullptr && std::strcmp(argv[1], rank) == 0) return 0;
  tnt::init(&argc, &argv);
  tnt::finalize();
  return 0;
}
