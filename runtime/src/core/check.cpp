#include "tarantella/check.hpp"

#include <mpi.h>

#include <cstring>

namespace tnt::detail {

std::string visible_nul(std::string message) {
  for (size_t at = message.find('\0'); at != std::string::npos; at = message.find('\0', at + 2))
    message.replace(at, 1, "\\0");
  return message;
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  // Paths are shortened to the part under runtime/ so messages stay readable.
  const char* short_file = std::strstr(file, "runtime/");
  throw Error(fmt::format("{} ({}:{})", msg, short_file ? short_file : file, line));
}

[[noreturn]] void throw_mpi_error(const char* file, int line, const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, text, &len);
  int rank = -1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw_error(file, line, fmt::format("MPI error on rank {} in {}: {}", rank, call, text));
}

}  // namespace tnt::detail
