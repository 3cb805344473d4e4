#!/usr/bin/env bash
# `tarantella predict` against a measurement (docs/scaling.md): fashion_mnist's CNN on the
# test bed, one rank a host, every host capped at 0.4 cores (`scripts/testbed cpu`: a cpu
# cgroup each, so that a rank's compute does not depend on how many hosts share this
# machine's cores) and its link at RATE (tc tbf on both ends of each veth pair). A profile
# on 2 hosts predicts the step on 3, as a user predicts a larger job from a small one; a
# run on 3 hosts measures it. The test fails when the median of three such predictions is
# off the median of the three measurements by more than TOLERANCE (below).
#
#   scaling_prediction.sh LAUNCHER FASHION_MNIST
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"

# 15%, the issue's target. Measured with this test on the shared 2-core development machine
# (2026-11-28, load average 3.4-5.6): -8.8%, -8.2%, -7.8% (and a fourth passed); the benchmark
# (scripts/bench/scaling_prediction, docs/scaling.md) put 3 hosts at 200 Mbit/s at -8.9%
# over 3 rounds, single rounds at 123-133 ms measured against 117-123 predicted. The rest
# of the margin is for the load: a cpu quota fences CPU time, not the caches and memory
# bandwidth other builds share with the ranks (at a load average of 8-9.5 single runs
# spread by up to 1.6x). Three rounds, each a profile and a measurement 10 s apart, and the
# medians: one disturbed run does not count. (The mean of two rounds did: at a load average
# of 15 one profile predicted 231 ms where the other predicted 140 and both measurements
# were 132-147 ms, and the mean was off by +32.8%, 1 run in 5; the other four were -10.5%
# to -0.1%.) A model off by a factor fails it by far: with the ring's
# bytes per rank not growing with the ranks (2/p instead of 2(p-1)/p) the prediction came
# out -46%.
TOLERANCE=0.15
# 200 Mbit/s: there the link, not the capped cores, sets the allreduce's pace, and the
# benchmark's points at 1-4 hosts were all within 10%; at 1 Gbit/s the allreduces are
# bound by the 0.4 cores they share with backward and single rounds spread more.
RATE=200mbit
PROFILE_HOSTS=h1,h2
MEASURE_HOSTS=h1,h2,h3

cl_up 3
"$cl_testbed" cpu 0.4 || cl_abort "cannot cap the test bed's hosts at 0.4 cores (scripts/testbed cpu 0.4)"
"$cl_testbed" rate "$RATE" || cl_abort "cannot rate-limit the test bed's links to $RATE"
# What a host starts is in its group: directly, and through the agent from another host
# (as Open MPI starts the ranks), whose view of /sys must still show the groups.
where=$("$cl_testbed" exec h2 cat /proc/self/cgroup; "$cl_testbed" exec h1 "$cl_agent" h3 cat /proc/self/cgroup)
if grep -Eq ':(cpu[^:]*)?:/tnt-h2$' <<<"$where" && grep -Eq ':(cpu[^:]*)?:/tnt-h3$' <<<"$where"; then
  cl_pass "testbed cpu: processes on h2 and h3 (through the agent) run in their hosts' cpu groups"
else
  cl_fail "testbed cpu: not in the hosts' cpu groups: $(tr '\n' ' ' <<<"$where")"
fi
# 32 samples a rank a step; 5 warm-up steps, 5 with one bucket, 20 profiled, one spare.
steps=20
args=(--train_epochs=1 --verbose=0)
run_args() { echo "--batch_size=$((32 * $1)) --num_train_samples=$((32 * $1 * (steps + 11)))"; }

for round in 1 2 3; do
  # shellcheck disable=SC2046
  cl_run profile_$round h1 120 -H "$PROFILE_HOSTS" -n 1 "${cl_launch[@]}" -x TNT_PROFILE_SCALING_STEPS=$steps \
    --profile-scaling "$cl_tmp/profile_$round.json" -- "${args[@]}" $(run_args 2) --model_dir="$cl_tmp/p_$round"
  cl_expect_exit profile_$round 0
  # shellcheck disable=SC2046
  cl_run measure_$round h1 120 -H "$MEASURE_HOSTS" -n 1 "${cl_launch[@]}" -x TNT_PROFILE_SCALING_STEPS=$steps \
    --profile-scaling "$cl_tmp/measured_$round.json" -- "${args[@]}" $(run_args 3) --model_dir="$cl_tmp/m_$round"
  cl_expect_exit measure_$round 0
  [[ -f $cl_tmp/profile_$round.json && -f $cl_tmp/measured_$round.json ]] || cl_abort "a profile of round $round is missing"
  # The link between hosts: the profile's own measurement (no --network, no --link-gbps).
  "$cl_launcher" predict "$cl_tmp/profile_$round.json" --nodes 3 --devices-per-node 1 \
    --csv "$cl_tmp/predicted_$round.csv" || cl_fail "predict: exit status $?"
done
"$cl_testbed" rate off
"$cl_testbed" cpu off

verdict=$(python3 - "$cl_tmp" "$TOLERANCE" "$RATE" <<'PY'
import csv, json, os, statistics, sys
d, tol, rate = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rounds = (1, 2, 3)
pred = [float(list(csv.DictReader(open("%s/predicted_%d.csv" % (d, r))))[0]["step_ms"]) for r in rounds]
meas = [json.load(open("%s/measured_%d.json" % (d, r)))["step_s"] * 1e3 for r in rounds]
prof = [json.load(open("%s/profile_%d.json" % (d, r)))["step_s"] * 1e3 for r in rounds]
p, m = statistics.median(pred), statistics.median(meas)
err = p / m - 1
ms = lambda xs: ", ".join("%.2f" % x for x in xs)
print("%s predicted %.2f ms (median of %s) on 3 hosts from 2, measured %.2f ms (median of %s) at %s "
      "(the profiles' own step %s ms): %+.1f%%, tolerance %.0f%% (load average %.1f)"
      % ("ok" if abs(err) <= tol else "FAIL", p, ms(pred), m, ms(meas), rate, ms(prof),
         100 * err, 100 * tol, os.getloadavg()[0]))
PY
)
echo "$verdict"
if [[ $verdict == ok* ]]; then cl_pass "prediction: ${verdict#ok }"; else cl_fail "prediction: ${verdict#FAIL }"; fi

cl_expect_no_processes 10 scaling_prediction
cl_finish
