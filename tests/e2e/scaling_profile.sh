#!/usr/bin/env bash
# --profile-scaling (docs/scaling.md) on fashion_mnist through the launcher: 2 ranks write a
# profile whose fields are sane (every gradient of the CNN with its size, ready times inside
# backward, the allreduce measured, the metrics' allreduce apart); 1 rank writes one without an allreduce; a profile that
# cannot be written ends the job before training with exit status 2 naming the file, on
# every rank; a run too short for a profile says so;
# --fusion-threshold auto trains and announces its choice once; with parameter servers the
# job trains, writes no profile and says why.
#
#   scaling_profile.sh LAUNCHER PROGRAM
source "$(dirname "${BASH_SOURCE[0]}")/fashion_mnist_common.sh" "$@"
fm_need_data

# check_profile NAME FILE RANKS: python reads the JSON; each failed check is one line.
check_profile() {
  local name=$1 file=$2 ranks=$3
  if [[ ! -f $file ]]; then
    fm_fail "$name: no profile at $file"
    return
  fi
  local problems
  problems=$(python3 - "$file" "$ranks" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
ranks = int(sys.argv[2])
bad = []
def want(cond, what):
    if not cond: bad.append(what)
want(p["format"] == "tarantella-scaling-profile" and p["version"] == 1, "format/version")
want(p["ranks"] == ranks and p["nodes"] == 1 and p["ranks_per_node"] == ranks, "ranks %r" % p["ranks"])
want(p["device"] == "cpu" and p["transport"] == "ring", "device/transport")
# 1024 samples at a global batch of 32: 32 steps, 5 of them warm-up and (2 ranks) 5 with one
# bucket; 20 asked for.
want(p["steps"] == 20, "steps %r (20 asked for)" % p["steps"])
want(p["samples_per_rank"] == 32 // ranks, "samples_per_rank %r" % p["samples_per_rank"])
want(p["threshold_bytes"] == 32 * 1024, "threshold_bytes")
for k in ("forward_s", "backward_s", "optimizer_s"):
    want(0 < p[k] < 1, "%s %r not in (0, 1) s" % (k, p[k]))
for k in ("input_s", "other_s", "exposed_comm_s"):
    want(0 <= p[k] < 1, "%s %r not in [0, 1) s" % (k, p[k]))
# The metrics' allreduce after every step, apart from other_s: loss, samples, an error flag
# and each metric's sums, 8 bytes a value (the CNN's loss counts samples, not tokens).
want(p.get("collectives") == 1, "collectives %r, not 1 (the metrics')" % p.get("collectives"))
cb = p.get("collective_bytes", 0)
want(cb >= 24 and cb % 8 == 0, "collective_bytes %r" % cb)
want(0 <= p.get("collectives_s", -1) < 1, "collectives_s %r not in [0, 1) s" % p.get("collectives_s"))
parts = p["input_s"] + p["forward_s"] + p["backward_s"] + p["optimizer_s"]
want(p["step_s"] >= 0.9 * parts, "step_s %r below its parts %r" % (p["step_s"], parts))
# The CNN of models/fashion_mnist: conv 1->32 3x3, conv 32->64 3x3, dense 3136->128, 128->10
# (f32: 4 bytes an element).
names = [g["name"] for g in p["gradients"]]
want(names == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
               "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], "names %r" % names)
sizes = [g["bytes"] for g in p["gradients"]]
want(sizes == [4 * n for n in (288, 32, 18432, 64, 3136 * 128, 128, 1280, 10)], "bytes %r" % sizes)
ready = [g["ready_s"] for g in p["gradients"]]
want(all(0 <= r <= p["backward_s"] + 1e-9 for r in ready), "ready times outside backward %r" % ready)
# Backward runs from the last layer: fc2's gradient is final before conv1's.
want(ready[6] < ready[0], "fc2.weight (%r) not before conv1.weight (%r)" % (ready[6], ready[0]))
# Every rank's input + forward + backward of every profiled step (the straggler term).
c = p.get("compute_samples_s", [])
want(len(c) == ranks * 20 and all(0 < x < 1 for x in c), "compute_samples_s: %d samples" % len(c))
if ranks > 1:
    # Backward alone (the one-bucket steps) and the allreduces' time in training.
    want(0 < p.get("backward_alone_s", 0) < 1, "backward_alone_s %r" % p.get("backward_alone_s"))
    want(0 < p.get("comm_s", 0) < 1, "comm_s %r" % p.get("comm_s"))
    a = p.get("allreduce")
    want(a is not None and a["ranks"] == ranks, "allreduce missing")
    if a:
        # One rank pair on one host: a latency from about a microsecond to a few ms on a
        # loaded 2-core machine, a bandwidth from 10 MB/s to 100 GB/s.
        want(1e-7 < a["a_s"] < 0.05, "allreduce a_s %r" % a["a_s"])
        want(1e-11 < a["b_s_per_byte"] < 1e-7, "allreduce b_s_per_byte %r" % a["b_s_per_byte"])
else:
    want("allreduce" not in p, "an allreduce measured on one rank")
    want(p.get("backward_alone_s") == 0 and p.get("comm_s") == 0, "backward_alone_s/comm_s on one rank")
print("\n".join(bad))
PY
  )
  if [[ $? -ne 0 ]]; then
    fm_fail "$name: python3 could not read $file"
  elif [[ -n $problems ]]; then
    while IFS= read -r line; do fm_fail "$name: $line"; done <<<"$problems"
  else
    fm_pass "$name: every field is sane"
  fi
}

args=(--num_train_samples=1024 --batch_size=32 --train_epochs=1 --verbose=0 --model_dir="$fm_tmp/model")
for ranks in 2 1; do
  name=np$ranks
  profile=$fm_tmp/profile$ranks.json
  fm_run "$name" -n "$ranks" -x TNT_NUM_THREADS=1 -x TNT_PROFILE_SCALING_STEPS=20 --profile-scaling "$profile" \
    -- "${args[@]}" --overwrite
  if [[ $fm_rc -eq 0 ]]; then fm_pass "$name: exit status 0"; else fm_fail "$name: exit status $fm_rc"; fi
  check_profile "$name" "$profile" "$ranks"
  [[ -e $profile.tmp ]] && fm_fail "$name: the temporary file $profile.tmp was left behind"
  n=$(grep -c "scaling profile of 20 steps on $ranks rank(s) written to $profile" <<<"$fm_out")
  [[ $n -eq 1 ]] && fm_pass "$name: said once where the profile went" || fm_fail "$name: the note appears $n times"
done

# Too short a run for a profile (8 steps on 2 ranks: 5 warm-up, 5 with one bucket): before,
# no file and not a word, exit 0. Now one warning naming the file and the steps needed.
name=short
fm_run "$name" -n 2 -x TNT_NUM_THREADS=1 --profile-scaling "$fm_tmp/short.json" \
  -- --num_train_samples=256 --batch_size=32 --train_epochs=1 --verbose=0 --model_dir="$fm_tmp/model" --overwrite
if [[ $fm_rc -eq 0 ]]; then fm_pass "$name: exit status 0"; else fm_fail "$name: exit status $fm_rc"; fi
n=$(grep -c "scaling profile: nothing written to '$fm_tmp/short.json' (yet): training ended after 8 step(s)" <<<"$fm_out")
[[ $n -eq 1 ]] && fm_pass "$name: said once why no profile came" || fm_fail "$name: the warning appears $n times"
[[ -e $fm_tmp/short.json ]] && fm_fail "$name: a profile was written" || fm_pass "$name: no profile written"

# --fusion-threshold auto: the master announces the choice once; the run trains as usual.
name=auto
fm_run "$name" -n 2 -x TNT_NUM_THREADS=1 --fusion-threshold auto -- "${args[@]}" --overwrite
if [[ $fm_rc -eq 0 ]]; then fm_pass "$name: exit status 0"; else fm_fail "$name: exit status $fm_rc"; fi
n=$(grep -c "^fusion threshold auto: " <<<"$fm_out")
[[ $n -eq 1 ]] && fm_pass "$name: the choice announced once" || fm_fail "$name: the choice announced $n times"

# Parameter servers: no allreduce to profile. The job trains, says why no profile comes,
# and writes none (it used to end on a null Reducer).
name=parameter_servers
fm_run "$name" -np 3 --parameter-servers 1 -x TNT_NUM_THREADS=1 -x TNT_PROFILE_SCALING_STEPS=2 \
  --profile-scaling "$fm_tmp/ps_profile.json" -- "${args[@]}" --strategy=parameter_server --overwrite
if [[ $fm_rc -eq 0 ]]; then fm_pass "$name: exit status 0"; else fm_fail "$name: exit status $fm_rc"; fi
grep -q "trains with parameter servers, so none is written" <<<"$fm_out" && fm_pass "$name: said why" ||
  fm_fail "$name: no word on the profile"
[[ -e $fm_tmp/ps_profile.json ]] && fm_fail "$name: a profile was written" || fm_pass "$name: no profile written"

# Refused at the start: with more profiled steps asked than the run has (32), only a check
# before training can fail it (the profile would be due after the run).
name=unwritable
fm_run "$name" -n 2 -x TNT_NUM_THREADS=1 -x TNT_PROFILE_SCALING_STEPS=1000 --profile-scaling "$fm_tmp/no/such/dir/p.json" \
  -- "${args[@]}" --overwrite
if [[ $fm_rc -eq 2 ]]; then fm_pass "$name: exit status 2"; else fm_fail "$name: exit status $fm_rc, expected 2"; fi
fm_expect_fixed "$name" "$fm_tmp/no/such/dir/p.json" "the profile file"

fm_finish
