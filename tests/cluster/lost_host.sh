#!/usr/bin/env bash
# A lost host: every process of h2 (its Open MPI daemon and both of its ranks) is killed in
# the middle of training. The job must end within 10 s with a non-zero status, and the
# launcher's report must name h2 and its ranks as lost, not blame a survivor for the
# SIGTERM that mpirun sent it afterwards. Nothing of the job may be left on any host.
#
#   lost_host.sh LAUNCHER FASHION_MNIST
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"
cl_up 2

# Long enough that it is still training when h2 goes (about 2 s an epoch here).
long=(--model=mlp --num_train_samples=8192 --batch_size=64 --train_epochs=20 --verbose=0 --model_dir="$cl_tmp/model")
(
  # Once both of h2's ranks train, and a moment more: kill the host.
  if cl_wait_for_programs h2 40 2; then
    sleep 2
    date +%s.%N >"$cl_tmp/killed_at"
    "$cl_testbed" kill h2
  fi
) &
killer=$!
cl_run lost h1 60 -H h1,h2:2 "${cl_launch[@]}" -- "${long[@]}"
wait "$killer"
[[ -f $cl_tmp/killed_at ]] || cl_abort "lost: h2's ranks never started training"
after=$(awk -v a="$(cat "$cl_tmp/killed_at")" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "the launcher returned ${after}s after h2 was killed"
if awk -v t="$after" 'BEGIN { exit !(t < 10) }'; then
  cl_pass "lost: the job ended ${after}s after the host was lost"
else
  cl_fail "lost: the job ended ${after}s after the host was lost (limit 10 s)"
fi
if [[ $cl_rc -ne 0 && $cl_rc -lt 124 ]]; then cl_pass "lost: exit status $cl_rc"; else cl_fail "lost: exit status $cl_rc, expected an error exit"; fi
if grep -Eq '^tarantella: rank [12] \(host h2, local rank [01]\) failed first: lost$' <<<"$cl_out"; then
  cl_pass "lost: the first failure is a rank of h2, lost"
else
  cl_fail "lost: no line 'tarantella: rank 1|2 (host h2, ...) failed first: lost'"
fi
cl_expect_contains lost "tarantella: ranks 1, 2 on h2: lost (" "h2 and both of its ranks are named as lost"
cl_expect_lacks lost "(host h1, local rank 0) failed first" "the survivor on h1 is not blamed"
cl_expect_lacks lost "no rank reported a failure" "no 'no rank reported a failure'"
cl_expect_no_processes 5 lost
cl_finish
