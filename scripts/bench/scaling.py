"""Scaling benchmark of a training program over 1, 2, 4, ... ranks (see scripts/bench/scaling).

Each run records a timeline (TNT_TIMELINE) of the measured steps, after the warmup steps; from
rank 0's events it takes, per step, the step time (the "input" wait plus the "step" span:
everything the training loop does for a batch) and the fraction of the gradient communication
hidden behind backward (per bucket, pack start to allreduce end, the part before backward ended,
summed over buckets: the definition of the runtime's "x% hidden" line). Throughput of a step =
global batch / step time. Mean and standard deviation go over every measured step of every
repeat at that rank count.
"""
import argparse
import csv
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

PROGRAMS = {
    # name: (flags per run; format fields: batch, samples, eval_samples, sentences, steps, model_dir)
    "fashion_mnist": [
        "--batch_size={batch}", "--train_epochs=1", "--num_train_samples={samples}", "--verbose=0",
        "--model_dir={model_dir}",
    ],
    "resnet50": [
        "--use_synthetic_data", "--batch_size={batch}", "--train_epochs=1", "--synthetic_samples={samples}",
        "--synthetic_eval_samples={eval_samples}", "--image_size=64", "--num_classes=10", "--log_steps=0",
        "--verbose=0", "--model_dir={model_dir}",
    ],
    # --batch_size and --micro-batch count tokens (sentences padded to --max_length), so the
    # throughput is tokens/s; {sentences} = sentences per step x steps.
    "transformer": [
        "--batch_size={batch}", "--train_epochs=1", "--num_sentences={sentences}", "--verbose=0",
        "--model_dir={model_dir}",
    ],
    # Any other program: it must take --batch_size (global), --train_steps and --model_dir.
    "other": ["--batch_size={batch}", "--train_steps={steps}", "--verbose=0", "--model_dir={model_dir}"],
}


def fail(message):
    sys.exit("scaling: " + message)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written; every option's default in its help line, unless the line
    already says what the default is (a computed one)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "default" not in h and action.option_strings and action.default not in (None, argparse.SUPPRESS):
            h += " (default: %(default)s)"
        return h


def parse_args():
    p = argparse.ArgumentParser(prog="scripts/bench/scaling", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--program", default="fashion_mnist",
                   help="fashion_mnist, resnet50 (synthetic data), or a path/name of another program in the build")
    p.add_argument("--ranks", default="", help="comma-separated rank counts (default: 1, 2, 4, ... up to --max-ranks)")
    p.add_argument("--max-ranks", type=int, default=0,
                   help="largest rank count (default: the SLURM allocation's tasks, else this machine's cores)")
    p.add_argument("--micro-batch", type=int, default=64, help="weak scaling: samples per rank and step")
    p.add_argument("--global-batch", type=int, default=0, help="strong scaling: this global batch at every rank count (0: weak scaling, --micro-batch per rank)")
    p.add_argument("--repeats", type=int, default=3, help="runs per rank count")
    p.add_argument("--warmup", type=int, default=3, help="steps not measured at the start of each run")
    p.add_argument("--steps", type=int, default=10, help="measured steps per run")
    p.add_argument("--threads-per-rank", type=int, default=0,
                   help="TNT_NUM_THREADS of each rank (default: cores / largest rank count, at least 1)")
    p.add_argument("--out", default="scaling_results", help="directory for scaling.csv, scaling_steps.csv, .md, .png and .pdf")
    p.add_argument("--title", default="", help="plot title (default: program and mode)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", ""), help="build directory (default: build/)")
    p.add_argument("--launcher", default="", help="the tarantella launcher (default: BUILD_DIR/bin/tarantella)")
    p.add_argument("--launcher-options", default="",
                   help="more launcher options, one string split as a shell would (e.g. '--fusion-threshold 512')")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    p.add_argument("program_args", nargs="*", help="after --: more flags for the program (override the defaults)")
    a = p.parse_args()
    for name in ("micro_batch", "repeats", "steps"):
        if getattr(a, name) < 1:
            fail("--%s %d: must be at least 1" % (name.replace("_", "-"), getattr(a, name)))
    if a.warmup < 0 or a.global_batch < 0 or a.threads_per_rank < 0 or a.max_ranks < 0:
        fail("--warmup, --global-batch, --threads-per-rank and --max-ranks must not be negative")
    return a


def slurm_hosts():
    if not os.environ.get("SLURM_JOB_ID"):
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        fail("scontrol show hostnames: " + out.stderr.strip())
    return out.stdout.split()


def slurm_ranks_per_node():
    """Ranks per node inside SLURM: SLURM_NTASKS_PER_NODE (set with --ntasks-per-node), else the
    allocation's SLURM_TASKS_PER_NODE ("2(x3),1"), which must then be the same on every node."""
    given = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    if given:
        return int(given.split("(")[0].split(",")[0])
    groups = os.environ.get("SLURM_TASKS_PER_NODE", "1")
    counts = {int(m.group(1)) for m in re.finditer(r"(\d+)(\(x\d+\))?(,|$)", groups)}
    if len(counts) != 1:
        fail("SLURM_TASKS_PER_NODE=%s: the nodes have different task counts; give --ntasks-per-node" % groups)
    return counts.pop()


def rank_counts(a, per_node, hosts):
    if a.ranks:
        try:
            counts = [int(x) for x in a.ranks.split(",")]
        except ValueError:
            fail("--ranks %s: expected comma-separated positive integers" % a.ranks)
        if any(c < 1 for c in counts):
            fail("--ranks %s: expected positive integers" % a.ranks)
        return counts
    top = a.max_ranks or (len(hosts) * per_node if hosts else os.cpu_count() or 1)
    counts, c = [], 1
    while c <= top:
        counts.append(c)
        c *= 2
    return counts


def merged_args(defaults, extra):
    """Program flags: the defaults, except those the user gave again after --."""
    names = {x.split("=", 1)[0] for x in extra if x.startswith("--")}
    return [d for d in defaults if d.split("=", 1)[0] not in names] + list(extra)


def step_stats(trace_path, first, last):
    """{step: (seconds, hidden fraction or None)} from rank 0's events."""
    events = json.load(open(trace_path))["traceEvents"]
    by_step = {}
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != 0:
            continue
        by_step.setdefault(e["args"]["step"], []).append(e)
    out = {}
    for step in range(first, last + 1):
        ev = by_step.get(step, [])
        spans = {}
        for e in ev:
            spans.setdefault(e["name"], []).append(e)
        if "step" not in spans or "input" not in spans:
            fail("%s: step %d has no step/input events (did the run stop early?)" % (trace_path, step))
        seconds = (spans["step"][0]["dur"] + spans["input"][0]["dur"]) * 1e-6
        hidden = None
        if "allreduce" in spans and "backward" in spans:
            b = spans["backward"][0]
            backward_end = b["ts"] + b["dur"]
            starts = {e["args"]["bucket"]: e["ts"] for e in spans.get("pack", [])}
            total = hid = 0.0
            for e in spans["allreduce"]:
                start = min(starts.get(e["args"]["bucket"], e["ts"]), e["ts"])
                end = e["ts"] + e["dur"]
                total += end - start
                hid += max(0.0, min(end, backward_end) - start)
            hidden = hid / total if total > 0 else 1.0
        out[step] = (seconds, hidden)
    return out


def main():
    a = parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bin_dir = os.path.join(a.build_dir or os.path.join(root, "build"), "bin")
    launcher = a.launcher or os.path.join(bin_dir, "tarantella")
    base_name = os.path.basename(a.program)
    kind = base_name if base_name in PROGRAMS and base_name != "other" else "other"
    unit = "tokens/s" if kind == "transformer" else "samples/s"
    max_length = 256  # the transformer's default
    for x in a.program_args:
        if x.startswith("--max_length="):
            max_length = int(x.split("=", 1)[1])
    program = a.program if os.path.sep in a.program else os.path.join(bin_dir, a.program)
    for f in (launcher, program):
        if not os.access(f, os.X_OK):
            fail("%s not found or not executable (build it, or set --build-dir / BUILD_DIR)" % f)

    hosts = slurm_hosts()
    per_node = slurm_ranks_per_node() if hosts else 1
    counts = rank_counts(a, per_node, hosts)
    cores = os.cpu_count() or 1
    threads = a.threads_per_rank or max(1, cores // (max(counts) if not hosts else per_node))
    mode = "strong" if a.global_batch else "weak"
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="tnt_scaling_")
    env = dict(os.environ, TNT_NUM_THREADS=str(threads), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    if os.getuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    first, last = a.warmup + 1, a.warmup + a.steps
    env["TNT_TIMELINE_STEPS"] = "%d-%d" % (first, last)

    print("scaling: %s, %s scaling, ranks %s, %d threads per rank, %d repeats, %d warmup + %d measured steps"
          % (base_name, mode, counts, threads, a.repeats, a.warmup, a.steps), flush=True)
    rows = []  # per step
    load_before = os.getloadavg()[0]
    try:
        for ranks in counts:
            batch = a.global_batch or a.micro_batch * ranks
            if batch < ranks:
                fail("global batch %d is smaller than %d ranks" % (batch, ranks))
            for rep in range(a.repeats):
                trace = os.path.join(work, "trace_%d_%d.json" % (ranks, rep))
                model_dir = os.path.join(work, "model_%d_%d" % (ranks, rep))
                steps_run = last + 1  # one more, so the window's last step is a whole one
                fields = dict(batch=batch, samples=batch * steps_run, eval_samples=batch, steps=steps_run,
                              sentences=batch // max_length * steps_run,
                              model_dir=model_dir)
                prog_args = merged_args([f.format(**fields) for f in PROGRAMS[kind]], a.program_args)
                cmd = [launcher, "--timeline", trace] + shlex.split(a.launcher_options)
                if hosts:
                    # Whole nodes of per_node ranks, or part of one node.
                    if ranks > per_node and ranks % per_node:
                        fail("%d ranks is not a multiple of %d ranks per node (SLURM_NTASKS_PER_NODE)" % (ranks, per_node))
                    nodes = max(1, ranks // per_node)
                    if nodes > len(hosts):
                        fail("%d ranks need %d nodes; the allocation has %d" % (ranks, nodes, len(hosts)))
                    cmd += ["-H", ",".join(hosts[:nodes]), "-n", str(min(ranks, per_node))]
                else:
                    nodes = 1
                    cmd += ["-n", str(ranks)]
                cmd += ["--", program] + prog_args
                print("  run: " + " ".join(shlex.quote(x) for x in cmd), flush=True)
                try:
                    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    fail("run did not finish within %g s: %s" % (a.timeout, " ".join(cmd)))
                if run.returncode != 0:
                    fail("run failed (status %d): %s\n%s" % (run.returncode, " ".join(cmd),
                                                              (run.stdout + run.stderr)[-4000:]))
                stats = step_stats(trace, first, last)
                for step, (seconds, hidden) in sorted(stats.items()):
                    rows.append(dict(program=base_name, mode=mode, nodes=nodes, ranks=ranks, repeat=rep, step=step,
                                     global_batch=batch, step_ms=seconds * 1e3, samples_per_s=batch / seconds,
                                     hidden_fraction="" if hidden is None else hidden))
                mean = statistics.mean(batch / s for s, _ in stats.values())
                print("  %d rank(s), global batch %d, repeat %d: %.1f %s" % (ranks, batch, rep + 1, mean, unit),
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    with open(os.path.join(a.out, "scaling_steps.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    summary = []
    base = None
    for ranks in counts:
        mine = [r for r in rows if r["ranks"] == ranks]
        tput = [r["samples_per_s"] for r in mine]
        hidden = [r["hidden_fraction"] for r in mine if r["hidden_fraction"] != ""]
        mean = statistics.mean(tput)
        std = statistics.stdev(tput) if len(tput) > 1 else 0.0
        if base is None:
            base = (ranks, mean)
        speedup = mean / base[1]
        ideal = ranks / base[0]  # weak: throughput grows with the ranks; strong: so does the speed of a step
        summary.append(dict(program=base_name, mode=mode, nodes=mine[0]["nodes"], ranks=ranks, global_batch=mine[0]["global_batch"],
                            threads_per_rank=threads, steps=len(tput), samples_per_s_mean=mean,
                            samples_per_s_std=std, step_ms_mean=statistics.mean(r["step_ms"] for r in mine),
                            speedup=speedup, efficiency=speedup / ideal,
                            hidden_fraction=statistics.mean(hidden) if hidden else ""))
    with open(os.path.join(a.out, "scaling.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0].keys()))
        w.writeheader()
        w.writerows(summary)

    title = a.title or "%s, %s scaling (%s)" % (base_name, mode,
                                                "global batch %d" % a.global_batch if a.global_batch
                                                else "%d %s per rank" % (a.micro_batch, unit.split("/")[0]))
    md = ["### " + title, "",
          "| ranks | global batch | %s (mean ± std) | step ms | speed-up | efficiency | comm. hidden |",
          "|---:|---:|---:|---:|---:|---:|---:|"]
    md[2] = md[2] % unit
    for s in summary:
        hid = "%.0f%%" % (100 * s["hidden_fraction"]) if s["hidden_fraction"] != "" else "-"
        md.append("| %d | %d | %.1f ± %.1f | %.1f | %.2f | %.0f%% | %s |" % (
            s["ranks"], s["global_batch"], s["samples_per_s_mean"], s["samples_per_s_std"], s["step_ms_mean"],
            s["speedup"], 100 * s["efficiency"], hid))
    md += ["", "%d threads per rank; %d runs per rank count; %d measured steps per run after %d warmup steps; "
           "mean and standard deviation over all measured steps. Load average (1 min) %.1f before, %.1f after, "
           "on %d cores." % (threads, a.repeats, a.steps, a.warmup, load_before, os.getloadavg()[0], cores), ""]
    with open(os.path.join(a.out, "scaling.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [s["ranks"] for s in summary]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=100)
    ax1.errorbar(xs, [s["samples_per_s_mean"] for s in summary], yerr=[s["samples_per_s_std"] for s in summary],
                 marker="o", capsize=3, label="measured")
    b0, t0 = xs[0], summary[0]["samples_per_s_mean"]
    ideal_t = [t0 * x / b0 for x in xs]
    ax1.plot(xs, ideal_t, "--", color="gray", label="ideal")
    ax1.set_xlabel("ranks")
    ax1.set_ylabel(unit)
    ax1.set_ylim(bottom=0)
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(xs, [str(x) for x in xs])
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(xs, [100 * s["efficiency"] for s in summary], marker="o", label="measured")
    ax2.axhline(100, linestyle="--", color="gray", label="ideal")
    ax2.set_xlabel("ranks")
    ax2.set_ylabel("efficiency (%)")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(xs, [str(x) for x in xs])
    ax2.set_ylim(0, 110)
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    for ext in ("png", "pdf"):
        fig.savefig(os.path.join(a.out, "scaling." + ext))
    print("scaling: wrote %s/{scaling.csv,scaling_steps.csv,scaling.md,scaling.png,scaling.pdf}" % a.out)


if __name__ == "__main__":
    main()
