"""Draws the CSV of `tarantella predict --plot` (launcher/predict.cpp runs this, beside the
launcher binary): throughput and scaling efficiency against nodes, at the threshold asked
for and at the best one, in the style of scripts/bench/scaling.py.

    python3 tnt_predict_plot.py PREDICT.csv OUT.png TITLE
"""
import csv
import sys

NO_MATPLOTLIB = 3


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: tnt_predict_plot.py PREDICT.csv OUT.png TITLE")
    src, out, title = sys.argv[1:]
    try:
        import matplotlib
    except ImportError:
        # The launcher tries the next Python on its list, and names them all if none has it.
        sys.exit(NO_MATPLOTLIB)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(src) as f:
        rows = list(csv.DictReader(f))
    xs = [int(r["nodes"]) for r in rows]
    thr = rows[0]["threshold_kb"] if rows else "?"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=100)
    ax1.plot(xs, [float(r["throughput"]) for r in rows], marker="o", label="%s KB" % thr)
    ax1.plot(xs, [float(r["best_throughput"]) for r in rows], marker="x", linestyle=":", label="best threshold")
    if rows:
        one = float(rows[0]["throughput"]) / int(rows[0]["nodes"])
        ax1.plot(xs, [one * x for x in xs], "--", color="gray", label="ideal")
    ax1.set_xlabel("nodes")
    ax1.set_ylabel("samples/s (predicted)")
    ax1.set_ylim(bottom=0)
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(xs, [str(x) for x in xs])
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(xs, [100 * float(r["efficiency"]) for r in rows], marker="o", label="%s KB" % thr)
    ax2.plot(xs, [100 * float(r["best_efficiency"]) for r in rows], marker="x", linestyle=":", label="best threshold")
    ax2.axhline(100, linestyle="--", color="gray", label="ideal")
    ax2.set_xlabel("nodes")
    ax2.set_ylabel("efficiency (%, predicted)")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(xs, [str(x) for x in xs])
    ax2.set_ylim(0, 110)
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as e:
        sys.exit("tarantella: error: --plot %s: cannot write it: %s" % (out, e.strerror))


if __name__ == "__main__":
    main()
