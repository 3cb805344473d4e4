// The timeline: a Chrome trace-event file (chrome://tracing, https://ui.perfetto.dev) of what
// each rank does in a window of training steps: the phases of each step on the compute
// thread (input, forward, loss, backward per layer, waiting for gradients, unpack,
// optimizer, metrics; evaluation and checkpoint writes) and each gradient bucket's pack and
// allreduce on the communication thread, with bucket bytes and tensor names. One process
// row per rank, "rank R on HOST".
//
// Usually switched on from outside the program:
//   tarantella --timeline trace.json -n 2 -- build/bin/fashion_mnist     (the launcher)
//   TNT_TIMELINE=trace.json TNT_TIMELINE_STEPS=20-30 build/bin/fashion_mnist
// or by the TensorBoard callback's profile_batch (the programs' --profile_steps), whose
// window counts from the callback's first step (callbacks.hpp). Steps count from 1 over the
// whole run (a resumed run goes on counting). With TNT_TIMELINE but no TNT_TIMELINE_STEPS the
// window is the first 10 steps this process trains (steps 49-58 of a run resumed after step
// 48); a window given (TNT_TIMELINE_STEPS, start_timeline) is taken as it is, and
// one that records nothing (not reached, or passed before the run began) is a warning that
// names it and the steps run. The window opens when its first step begins and closes
// when the step after its last begins (or training ends), so an evaluation or checkpoint
// right after the last step is in it. A path that names a directory is an InputError on
// every rank when the recorder starts (at the start of fit()), before anything is written.
//
// Each rank appends its events to PATH.rank<R> after every step of the window (the JSON
// array form Chrome reads without its closing bracket: a rank that dies leaves the parts of
// the others, and its own up to its last complete step, readable). At the end of fit() the
// ranks send their events to the master, which writes PATH (written to a temporary and
// renamed) and removes the parts.
//
// Clocks: every rank's timestamps are moved onto rank 0's steady clock when the recorder
// starts. A rank on rank 0's machine reads that clock itself (offset 0). The others: 16
// times a barrier, then rank 0 broadcasts its clock; each rank keeps the largest difference
// "rank 0's clock - mine at receipt", which falls short of the true offset by the smallest
// broadcast latency seen (tens of microseconds over a network). Time 0 is rank 0's clock
// when the recorder started.
#pragma once

#include "tarantella/config.hpp"  // parse_step_window

#include <cstdint>
#include <string>

namespace tnt {

// Collective. Starts recording steps first_step..last_step (1-based, inclusive) into path.
// A timeline already started (TNT_TIMELINE, an earlier call) is kept; the call then warns
// and returns false. Throws InputError on every rank for an empty path, a path naming a
// directory, or a bad window.
bool start_timeline(const std::string& path, int64_t first_step, int64_t last_step);
// Collective. Merges what was recorded into the file and stops; nothing without a timeline.
void stop_timeline();
// "a-b" (or "a" for one step) -> {a, b}; InputError naming `what` otherwise.

}  // namespace tnt
