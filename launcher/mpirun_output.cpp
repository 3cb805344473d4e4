#include "mpirun_output.hpp"

#include "text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

namespace tnt::launcher {

namespace {

constexpr size_t kOpenMpiSeparator = 74;  // dashes in the line that frames Open MPI's help blocks

// Open MPI's help blocks are framed by a line of 74 dashes; shorter runs of dashes are a
// program's own.
bool is_separator(std::string_view line) {
  line = trim(line);
  return line.size() >= 40 && std::all_of(line.begin(), line.end(), [](char c) { return c == '-'; });
}

// The first line of each block that only restates a failure the launcher reports itself
// (Open MPI 4.1's help-mpi-api.txt, help-errmgr-base.txt and help-orterun.txt; "%s" there
// is mpirun's own name, so the texts are matched after it).
bool opens_failure_block(std::string_view line) {
  for (std::string_view text : {"MPI_ABORT was invoked on rank ", "Primary job  terminated normally",
                                "Primary job terminated normally",
                                " detected that one or more processes exited with non-zero status",
                                " noticed that process rank ", " noticed that the job aborted",
                                " has exited due to process rank ", " has exited due to a process exiting without",
                                "ORTE was unable to reliably start one or more daemons"}) {
    if (line.find(text) != std::string_view::npos) return true;
  }
  return false;
}

// The process id of a line that Open MPI's signal handler wrote, "[host:PID] ..." (the id
// may be padded with zeros), else -1.
long line_pid(std::string_view line) {
  if (line.empty() || line.front() != '[') return -1;
  const size_t close = line.find(']');
  if (close == std::string_view::npos || close > 300) return -1;
  const size_t colon = line.rfind(':', close);
  if (colon == std::string_view::npos || colon + 1 == close || close - colon > 12) return -1;
  long pid = 0;
  for (size_t i = colon + 1; i < close; ++i) {
    if (line[i] < '0' || line[i] > '9') return -1;
    pid = pid * 10 + (line[i] - '0');
  }
  return pid;
}

// Lines that Open MPI's daemons print about the same failure: "[host:pid] [[job,0],0]
// ORTE_ERROR_LOG: ... in file ../../../orte/util/show_help.c at line 507", and the notes
// "[host:pid] 1 more process has sent help message help-mpi-api.txt / mpi-abort" and
// "[host:pid] Set MCA parameter "orte_base_help_aggregate" to 0 to see all help / error
// messages"; and a rank's transport that lost its peer when that rank was killed, "[host:pid]
// Read -1, expected 2101248, errno = 3" (the launcher names the killed rank); and PMIx's own
// "[host:pid] PMIX ERROR: BAD-PARAM in file ../../../src/event/pmix_event_notification.c at
// line 1033" when a rank is gone (a parameter-server worker dropped: the launcher says so).
bool is_noise_line(std::string_view line) {
  if (line.empty() || line.front() != '[') return false;
  const size_t pmix = line.find("] PMIX ERROR: ");
  if (pmix != std::string_view::npos && line_pid(line) >= 0 && line.find(" in file ", pmix) != std::string_view::npos) {
    return true;
  }
  const size_t read = line.find("] Read -1, expected ");
  if (read != std::string_view::npos && line_pid(line) >= 0 && line.find(", errno = ", read) != std::string_view::npos) {
    return true;
  }
  return line.find("] ORTE_ERROR_LOG: ") != std::string_view::npos ||
         (line.find(" sent help message ") != std::string_view::npos &&
          line.find(" more process") != std::string_view::npos) ||
         line.find("Set MCA parameter \"orte_base_help_aggregate\" to 0") != std::string_view::npos;
}

// A framed block longer than this is no restated failure: it is passed on.
constexpr size_t max_block_lines = 40;

// "error (rank R of P): message\n", as tnt::run_main prints a rank's error: R, P and the
// message, or nothing.
struct RankErrorLine {
  std::string rank, size, message;
};
std::optional<RankErrorLine> rank_error_line(std::string_view line) {
  constexpr std::string_view head = "error (rank ";
  if (line.substr(0, head.size()) != head) return std::nullopt;
  auto digits = [&](size_t at) {
    size_t end = at;
    while (end < line.size() && line[end] >= '0' && line[end] <= '9') ++end;
    return end;
  };
  // Up to 9 digits each: ranks of any real job, and never too long for a long.
  const size_t rank_end = digits(head.size());
  if (rank_end == head.size() || rank_end - head.size() > 9 || line.substr(rank_end, 4) != " of ") {
    return std::nullopt;
  }
  const size_t size_end = digits(rank_end + 4);
  if (size_end == rank_end + 4 || size_end - rank_end - 4 > 9 || line.substr(size_end, 3) != "): ") {
    return std::nullopt;
  }
  return RankErrorLine{std::string(line.substr(head.size(), rank_end - head.size())),
                       std::string(line.substr(rank_end + 4, size_end - rank_end - 4)),
                       std::string(line.substr(size_end + 3))};
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l;
  return out;
}

constexpr std::string_view daemons_failed_text = "ORTE was unable to reliably start one or more daemons";
constexpr std::string_view improperly_text = " exiting improperly";

// N of "mpirun has exited due to process rank N with PID ...", else nothing.
std::optional<int> exited_process_rank(std::string_view line) {
  constexpr std::string_view head = " has exited due to process rank ";
  const size_t at = line.find(head);
  if (at == std::string_view::npos) return std::nullopt;
  size_t i = at + head.size(), end = i;
  while (end < line.size() && end - i < 9 && line[end] >= '0' && line[end] <= '9') ++end;
  if (end == i || line.substr(end, 10) != " with PID ") return std::nullopt;
  return std::stoi(std::string(line.substr(i, end - i)));
}

// A host name as ssh prints it: no spaces, not empty, within a sane length.
bool plausible_host(std::string_view name) {
  return !name.empty() && name.size() <= 255 && name.find_first_of(" \t") == std::string_view::npos;
}

}  // namespace

// 1, 2, 3, 5, 7, 8 -> "1-3, 5, 7-8".
std::string rank_ranges(std::vector<long> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::optional<HostProblem> host_problem(std::string_view line) {
  line = trim(line);
  const std::string said(line);
  // OpenSSH: "ssh: Could not resolve hostname NAME: REASON"
  constexpr std::string_view resolve = "ssh: Could not resolve hostname ";
  if (starts_with(line, resolve)) {
    std::string_view rest = line.substr(resolve.size());
    std::string_view name = rest.substr(0, rest.find(": "));
    if (plausible_host(name) && name.size() < rest.size()) return HostProblem{std::string(name), said};
  }
  // "ssh: connect to host NAME port 22: Connection refused" (or timed out, No route to host)
  constexpr std::string_view connect = "ssh: connect to host ";
  if (starts_with(line, connect)) {
    std::string_view rest = line.substr(connect.size());
    const size_t port = rest.find(" port ");
    if (port != std::string_view::npos && plausible_host(rest.substr(0, port)) &&
        rest.find(": ", port) != std::string_view::npos) {
      return HostProblem{std::string(rest.substr(0, port)), said};
    }
  }
  // "USER@NAME: Permission denied (publickey,password)."
  const size_t denied = line.find(": Permission denied");
  const size_t at = line.substr(0, denied).rfind('@');
  if (denied != std::string_view::npos && at != std::string_view::npos && at > 0) {
    std::string_view name = line.substr(at + 1, denied - at - 1);
    if (plausible_host(name) && line.substr(0, at).find(' ') == std::string_view::npos) {
      return HostProblem{std::string(name), said};
    }
  }
  return std::nullopt;
}

void MpirunOutputFilter::hold(const std::string& text) {
  const size_t room = held_limit - std::min(held_limit, held_.size());
  held_ += text.substr(0, room);
  dropped_bytes_ += text.size() - std::min(room, text.size());
}

// Whether `text` (a whole line) repeats an earlier rank's error, or continues one that does
// (indented); a rank's first error line is remembered.
bool MpirunOutputFilter::repeated_error(const std::string& text) {
  if (in_repeat_ && text.size() > 2 && text[0] == ' ' && text[1] == ' ') return true;
  in_repeat_ = false;
  std::optional<RankErrorLine> e = rank_error_line(text);
  if (!e) return false;
  for (RankError& known : errors_) {
    if (known.size != e->size || known.message != e->message) continue;
    if (known.first == e->rank) return false;  // the same rank twice: its own lines
    known.repeated_by.push_back(std::stol(e->rank));
    in_repeat_ = true;
    return true;
  }
  if (errors_.size() < max_distinct_errors) errors_.push_back({e->size, e->message, e->rank, {}});
  return false;
}

std::string MpirunOutputFilter::finish() {
  std::string out;
  for (const RankError& e : errors_) {
    if (e.repeated_by.empty()) continue;
    out += fmt::format("error (rank{} {} of {}): the same error as rank {}\n", e.repeated_by.size() > 1 ? "s" : "",
                       rank_ranges(e.repeated_by), e.size, e.first);
  }
  errors_.clear();
  return out;
}

// `text` is one whole line, its newline included.
void MpirunOutputFilter::line(std::string text, std::string& out) {
  if (text.find(daemons_failed_text) != std::string::npos) daemons_failed_ = true;
  if (std::optional<int> r = exited_process_rank(text)) {
    improper_rank_ = r;
    improper_ = text.find(improperly_text) != std::string::npos;
  } else if (improper_rank_ && text.find(improperly_text) != std::string::npos) {
    improper_ = true;  // Open MPI breaks the line before "node <host> exiting improperly."
  }
  if (auto p = host_problem(text)) {
    const bool known = std::any_of(host_problems_.begin(), host_problems_.end(),
                                   [&](const HostProblem& h) { return h.host == p->host; });
    if (!known && host_problems_.size() < max_distinct_errors) host_problems_.push_back(std::move(*p));
  }
  // mpirun's own crash report, and its answer to a signal while it ends the job already
  // (a line and an empty one).
  const bool from_mpirun = mpirun_pid_ > 0 && line_pid(text) == mpirun_pid_;
  if (std::exchange(after_abort_note_, false) && (text == "\n" || text == "\r\n")) {
    hold(text);
    return;
  }
  if (block_.empty() && from_mpirun && text.find("*** Process received signal ***") != std::string::npos) {
    in_crash_ = true;
    crash_lines_ = 0;
  }
  if (in_crash_) {
    hold(text);
    if (text.find("*** End of error message ***") != std::string::npos || ++crash_lines_ > max_block_lines) {
      in_crash_ = false;
    }
    return;
  }
  // mpirun's word that it passes a signal on (SIGUSR1 and SIGUSR2, which the launcher hands
  // it for the ranks; launcher.md): the launcher's doing, not news, and not kept for the
  // end either (held-back text is shown when no rank's failure explains the job's end).
  if (block_.empty() && text.rfind("mpirun: Forwarding signal ", 0) == 0 &&
      text.find(" to job", 26) != std::string::npos) {
    return;
  }
  if (block_.empty() && text.rfind("mpirun: abort is already in progress", 0) == 0) {
    hold(text);
    after_abort_note_ = true;
    return;
  }
  if (block_.empty() && repeated_error(text)) return;
  if (!block_.empty()) {
    if (block_.size() == 1 && !opens_failure_block(text)) {
      // A separator that opens something else: pass it on, and read this line afresh.
      out += block_.front();
      block_.clear();
    } else {
      block_.push_back(std::move(text));
      if (is_separator(block_.back())) {
        hold(joined(block_));
        block_.clear();
      } else if (block_.size() > max_block_lines) {
        out += joined(block_);
        block_.clear();
      }
      return;
    }
  }
  if (is_separator(text)) {
    block_.push_back(std::move(text));
  } else if (is_noise_line(text)) {
    hold(text);
  } else {
    out += text;
  }
}

std::string MpirunOutputFilter::feed(std::string_view bytes) {
  std::string out;
  partial_.append(bytes);
  size_t start = 0;
  for (size_t nl = partial_.find('\n'); nl != std::string::npos; nl = partial_.find('\n', start)) {
    const std::string whole = partial_.substr(start, nl + 1 - start);
    // A rank's last line that had no newline, and Open MPI's separator right behind it in
    // the same pipe ("...last words--------...--\n"): two lines, so that the block the
    // separator opens is still known.
    size_t text_end = whole.size() - 1;
    while (text_end > 0 && (whole[text_end - 1] == '\r' || whole[text_end - 1] == ' ')) --text_end;
    size_t dashes_at = text_end;
    while (dashes_at > 0 && whole[dashes_at - 1] == '-') --dashes_at;
    // Exactly Open MPI's 74 dashes, behind text that is not blank: a program's own rule of
    // dashes at the end of its line stays as it is.
    const bool text_before = whole.find_first_not_of(" \t", 0) < dashes_at;
    if (text_end - dashes_at == kOpenMpiSeparator && dashes_at > 0 && text_before) {
      line(whole.substr(0, dashes_at) + "\n", out);
      line(whole.substr(dashes_at), out);
    } else {
      line(whole, out);
    }
    start = nl + 1;
  }
  partial_.erase(0, start);
  return out;
}

std::string MpirunOutputFilter::flush() {
  std::string out = joined(block_) + partial_;
  block_.clear();
  partial_.clear();
  return out;
}

std::string MpirunOutputFilter::held_back() const {
  if (dropped_bytes_ == 0) return held_;
  return held_ + fmt::format("[{} more bytes of mpirun's messages not shown]\n", dropped_bytes_);
}

}  // namespace tnt::launcher
