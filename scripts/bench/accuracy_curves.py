"""Accuracy per epoch of fashion_mnist at several scales (see scripts/bench/accuracy_curves).

At R ranks the global batch is base_batch * R and the learning rate is scaled linearly
(fashion_mnist --scale_learning_rate: lr * batch / 128), optionally with --warmup_epochs.
Training and validation accuracy per epoch come from each run's history.csv.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile


def fail(message):
    sys.exit("accuracy_curves: " + message)


def parse_args():
    p = argparse.ArgumentParser(prog="scripts/bench/accuracy_curves", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2,4,8", help="comma-separated rank counts")
    p.add_argument("--epochs", type=int, default=5, help="epochs per run")
    p.add_argument("--base-batch", type=int, default=128, help="global batch at 1 rank (times R at R ranks)")
    p.add_argument("--warmup-epochs", type=float, default=0, help="fashion_mnist --warmup_epochs")
    p.add_argument("--no-scale-learning-rate", action="store_true", help="keep the learning rate at every scale")
    p.add_argument("--threads-per-rank", type=int, default=1, help="TNT_NUM_THREADS of each rank")
    p.add_argument("--out", default="accuracy_results", help="directory for accuracy.csv, .md, PNG and PDF files")
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", ""), help="build directory (default: build/)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    p.add_argument("--from-csv", default="", help="plot an earlier run's accuracy.csv again instead of training")
    p.add_argument("program_args", nargs="*", help="after --: more flags for fashion_mnist")
    a = p.parse_args()
    try:
        a.rank_list = [int(x) for x in a.ranks.split(",")]
    except ValueError:
        fail("--ranks %s: expected comma-separated positive integers" % a.ranks)
    if any(r < 1 for r in a.rank_list) or a.epochs < 1 or a.base_batch < 1 or a.threads_per_rank < 1:
        fail("--ranks, --epochs, --base-batch and --threads-per-rank must be positive")
    if a.warmup_epochs < 0:
        fail("--warmup-epochs %g: must not be negative" % a.warmup_epochs)
    return a


def main():
    a = parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bin_dir = os.path.join(a.build_dir or os.path.join(root, "build"), "bin")
    launcher, program = os.path.join(bin_dir, "tarantella"), os.path.join(bin_dir, "fashion_mnist")
    for f in (launcher, program):
        if not os.access(f, os.X_OK):
            fail("%s not found or not executable (build it, or set --build-dir / BUILD_DIR)" % f)
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, TNT_NUM_THREADS=str(a.threads_per_rank),
               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    if os.getuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    work = tempfile.mkdtemp(prefix="tnt_accuracy_")
    rows = []
    if a.from_csv:
        rows = [dict(r, ranks=int(r["ranks"]), global_batch=int(r["global_batch"]), epoch=int(r["epoch"]),
                     **{k: float(r[k]) for k in ("accuracy", "val_accuracy", "loss", "val_loss", "learning_rate",
                                                  "seconds")}) for r in csv.DictReader(open(a.from_csv))]
        a.rank_list = sorted({r["ranks"] for r in rows})
    try:
        for ranks in ([] if a.from_csv else a.rank_list):
            batch = a.base_batch * ranks
            model_dir = os.path.join(work, "ranks_%d" % ranks)
            cmd = [launcher, "-n", str(ranks), "--", program, "--batch_size=%d" % batch,
                   "--train_epochs=%d" % a.epochs, "--model_dir=" + model_dir, "--verbose=0",
                   "--warmup_epochs=%g" % a.warmup_epochs]
            if not a.no_scale_learning_rate:
                cmd.append("--scale_learning_rate")
            cmd += a.program_args
            print("accuracy_curves: %d rank(s), global batch %d: %s" % (ranks, batch, " ".join(cmd)), flush=True)
            try:
                run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                fail("run did not finish within %g s: %s" % (a.timeout, " ".join(cmd)))
            if run.returncode != 0:
                fail("run failed (status %d): %s\n%s" % (run.returncode, " ".join(cmd), (run.stdout + run.stderr)[-4000:]))
            history = list(csv.DictReader(open(os.path.join(model_dir, "history.csv"))))
            if len(history) != a.epochs:
                fail("%s/history.csv has %d rows, expected %d" % (model_dir, len(history), a.epochs))
            for h in history:
                rows.append(dict(ranks=ranks, global_batch=batch, epoch=int(h["epoch"]),
                                 accuracy=float(h["accuracy"]), val_accuracy=float(h["val_accuracy"]),
                                 loss=float(h["loss"]), val_loss=float(h["val_loss"]),
                                 learning_rate=float(h["learning_rate"]), seconds=float(h["seconds"])))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    with open(os.path.join(a.out, "accuracy.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    lr_text = "LR scaled linearly (base batch 128)" if not a.no_scale_learning_rate else "LR fixed"
    warm = ", %g warmup epoch(s)" % a.warmup_epochs if a.warmup_epochs else ""
    md = ["### fashion_mnist accuracy per scale (%d epochs, %s%s)" % (a.epochs, lr_text, warm), "",
          "| ranks | global batch | final train accuracy | final validation accuracy | best validation accuracy |",
          "|---:|---:|---:|---:|---:|"]
    for ranks in a.rank_list:
        mine = [r for r in rows if r["ranks"] == ranks]
        md.append("| %d | %d | %.4f | %.4f | %.4f |" % (ranks, mine[0]["global_batch"], mine[-1]["accuracy"],
                                                      mine[-1]["val_accuracy"], max(r["val_accuracy"] for r in mine)))
    md.append("")
    with open(os.path.join(a.out, "accuracy.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for ranks in a.rank_list:
        mine = [r for r in rows if r["ranks"] == ranks]
        fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=100)
        ax.plot([r["epoch"] for r in mine], [r["accuracy"] for r in mine], marker="o", label="training")
        ax.plot([r["epoch"] for r in mine], [r["val_accuracy"] for r in mine], marker="s", label="validation")
        ax.set_xlabel("epoch")
        ax.set_ylabel("accuracy")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title("%d rank(s), global batch %d" % (ranks, mine[0]["global_batch"]), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        for ext in ("png", "pdf"):
            fig.savefig(os.path.join(a.out, "accuracy_ranks%d.%s" % (ranks, ext)))
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=100)
    for i, ranks in enumerate(a.rank_list):
        mine = [r for r in rows if r["ranks"] == ranks]
        color = "C%d" % i
        ax.plot([r["epoch"] for r in mine], [r["accuracy"] for r in mine], "--", color=color,
                label="%d rank(s) training" % ranks)
        ax.plot([r["epoch"] for r in mine], [r["val_accuracy"] for r in mine], "-", marker="o", color=color,
                label="%d rank(s) validation" % ranks)
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("fashion_mnist: %s%s" % (lr_text, warm), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    for ext in ("png", "pdf"):
        fig.savefig(os.path.join(a.out, "accuracy_overlay.%s" % ext))
    print("accuracy_curves: wrote %s/{accuracy.csv,accuracy.md,accuracy_ranks*.{png,pdf},accuracy_overlay.{png,pdf}}"
          % a.out)


if __name__ == "__main__":
    main()
