// Where each rank is on one communicator, as the arrival channel reports it, and what is
// judged from that: whether the ranks called different collectives under one number (a
// mismatch: user code under is_master_rank(), say, that calls a collective on the master
// only), and how a message says where each rank is. Pure: no MPI, no sockets.
//
// Two ranks are compared only on collective numbers both remember (each keeps its last
// few), never on "where they are now": ranks may legitimately be at different numbers (a
// broadcast root that finished while the others still receive, a rank still computing).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt::detail {

struct OpRecord {
  int64_t seq = 0;   // the collective's number on its communicator (from 1)
  std::string key;   // what every rank's call must agree on
  std::string text;  // for messages: "allreduce_sum(2 value(s)) in save_weights"
};

struct RankPosition {
  bool answered = false;
  int64_t entered = 0;  // the last collective entered (0: none yet)
  int64_t done = 0;     // the last one finished; equal to entered when in none now
  // Its program is done: it is in tnt::finalize (MPI_Finalize) and calls no collective again.
  bool finished = false;
  std::vector<OpRecord> recent;  // its last few collectives, in ascending number

  bool inside() const { return entered > done; }
  const OpRecord* at(int64_t seq) const;  // nullptr when not remembered
  // "in #5 allreduce_sum(2 value(s))", "in no collective (last finished: #4 barrier)",
  // "finished its program (last collective: #4 barrier)", "did not answer"
  std::string str() const;
};

// The wire form the arrival channel sends: "entered done finished\n", "seq\tkey\ttext\n" per record,
// then ".\n". decode() returns false on anything else (an answer cut short, too).
std::string encode(const RankPosition& position);
bool decode(const std::string& text, RankPosition& out);

struct Mismatch {
  int64_t seq = 0;  // the first number under which ranks called different collectives
  // (the call's text, the ranks that made it), in order of the lowest rank
  std::vector<std::pair<std::string, std::vector<int>>> groups;
};
// Entry q of ranks is rank q's position (ranks that did not answer are left out).
std::optional<Mismatch> find_mismatch(const std::vector<RankPosition>& ranks);
// The ranks that finished their program without entering collective `seq`: they never will.
std::vector<int> finished_before(const std::vector<RankPosition>& ranks, int64_t seq);

using RankListFormat = std::function<std::string(const std::vector<int>&)>;
// "rank(s) 0, 2: in #5 barrier; rank(s) 1: in no collective (last finished: #4 barrier)"
std::string describe_positions(const std::vector<RankPosition>& ranks, const RankListFormat& format);
// "as collective #5, rank(s) 0 called allreduce_sum(2 value(s)) and rank(s) 1 called
// barrier"
std::string describe_mismatch(const Mismatch& m, const RankListFormat& format);

// What to do about a mismatch, in the words of a user's program.
inline constexpr const char* kMismatchFix =
    "every rank must call the same collectives in the same order: a collective called on some ranks only (code "
    "under tnt::is_master_rank(), or a callback that runs on the master only) leaves the others waiting; call it on "
    "every rank (a callback: construct it with Callback::Ranks::all)";

}  // namespace tnt::detail
