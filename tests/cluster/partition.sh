#!/usr/bin/env bash
# A network partition: h2's link goes down in the middle of training (its processes live
# on, cut off). With TNT_COLLECTIVE_TIMEOUT=6 the job must end by itself within 6 + 20 s,
# name the unreachable rank and host (the launcher, and the collective timeout of the rank
# left waiting: "rank(s) 1 (host h2) did not answer"), and within 30 s of the cut no
# process of the job may be left on any host, the cut-off one included (its rank's step
# hears no heartbeat from the launcher, ends its program and the Open MPI daemon).
# The collective timeout (6 s) is well below the heartbeat timeout (15 s), so rank 0's
# own report comes before the launcher gives up on h2 even on a loaded machine (with 10 s
# the two raced: 10 s + the 2 s arrival query + scheduling delays against 15 s).
#
#   partition.sh LAUNCHER FASHION_MNIST
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"
cl_up 2

long=(--model=mlp --num_train_samples=8192 --batch_size=64 --train_epochs=20 --verbose=0 --model_dir="$cl_tmp/model")
(
  if cl_wait_for_programs h2 40 1; then
    sleep 2
    date +%s.%N >"$cl_tmp/cut_at"
    "$cl_testbed" cut h2
    # Watch the hosts from the cut on: when was the last process of the job gone?
    end=$((SECONDS + 40))
    while ((SECONDS < end)); do
      if [[ -z $(cl_host_processes) ]]; then
        date +%s.%N >"$cl_tmp/empty_at"
        break
      fi
      sleep 0.25
    done
  fi
) &
watcher=$!
TNT_COLLECTIVE_TIMEOUT=6 cl_run partition h1 60 -H h1,h2 "${cl_launch[@]}" -- "${long[@]}"
[[ -f $cl_tmp/cut_at ]] || cl_abort "partition: h2's rank never started training"
after=$(awk -v a="$(cat "$cl_tmp/cut_at")" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "the launcher returned ${after}s after the cut"
wait "$watcher"
if awk -v t="$after" 'BEGIN { exit !(t < 26) }'; then
  cl_pass "partition: the job ended ${after}s after the cut (TNT_COLLECTIVE_TIMEOUT 6 + 20)"
else
  cl_fail "partition: the job ended ${after}s after the cut (limit 26 s)"
fi
if [[ $cl_rc -ne 0 && $cl_rc -lt 124 ]]; then cl_pass "partition: exit status $cl_rc"; else cl_fail "partition: exit status $cl_rc, expected an error exit"; fi
cl_expect_contains partition "tarantella: rank 1 (host h2, local rank 0) unreachable: no heartbeat for" \
  "the launcher names the unreachable rank and host"
cl_expect_contains partition "tarantella: rank 1 on h2: unreachable (" "the final report names them too"
cl_expect_contains partition "rank(s) 1 (host h2) did not answer the arrival query" \
  "the collective timeout names the rank that cannot be reached, across hosts"
if [[ -f $cl_tmp/empty_at ]]; then
  gone=$(awk -v a="$(cat "$cl_tmp/cut_at")" -v b="$(cat "$cl_tmp/empty_at")" 'BEGIN { printf "%.1f", b - a }')
  if awk -v t="$gone" 'BEGIN { exit !(t < 30) }'; then
    cl_pass "partition: no process of the job on any host ${gone}s after the cut"
  else
    cl_fail "partition: processes of the job were left on the hosts until ${gone}s after the cut (limit 30 s)"
  fi
else
  cl_fail "partition: processes of the job were still on the hosts 40 s after the cut:"
  cl_host_processes
fi
cl_finish
