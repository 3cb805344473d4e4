// Errors and check macros. Library code throws tnt::Error; only a program's main decides
// to exit. Each library gets its own macro that reports file, line and the library's own
// error string (TNT_MPI_CHECK here; TNT_CUDA_CHECK, TNT_CUDNN_CHECK, TNT_CUBLAS_CHECK and
// TNT_NCCL_CHECK live in the CUDA backend's private header).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tnt {

namespace detail {
// The message with each NUL byte written as \0: what() is a C string, and a NUL quoted from
// a user's file would end the message there.
std::string visible_nul(std::string message);
}  // namespace detail

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(detail::visible_nul(message)) {}
  explicit Error(const char* message) : std::runtime_error(message) {}
};

// A user's input (flag, file, batch size, checkpoint) is wrong: the message names it.
class InputError : public Error {
 public:
  using Error::Error;
};

// A collective did not complete in time, or ranks disagree on what they are doing.
class CommError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_mpi_error(const char* file, int line, const char* call, int code);
}  // namespace detail

}  // namespace tnt

// A mistake of the user (a flag, a file, a batch size, a checkpoint): InputError with the
// message alone (no source location: it is about the input, not the code). Every check of
// user input goes through these two.
#define TNT_INPUT_ERROR(...) throw ::tnt::InputError(::fmt::format(__VA_ARGS__))

#define TNT_INPUT_CHECK(cond, ...)                                   \
  do {                                                               \
    if (!(cond)) throw ::tnt::InputError(::fmt::format(__VA_ARGS__)); \
  } while (0)

// An internal error (a broken invariant, a failed library call): Error with file and line.
#define TNT_THROW(...) ::tnt::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#define TNT_CHECK(cond, ...)                                                         \
  do {                                                                               \
    if (!(cond)) ::tnt::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define TNT_MPI_CHECK(call)                                                   \
  do {                                                                        \
    int tnt_mpi_rc_ = (call);                                                 \
    if (tnt_mpi_rc_ != 0) ::tnt::detail::throw_mpi_error(__FILE__, __LINE__, #call, tnt_mpi_rc_); \
  } while (0)
