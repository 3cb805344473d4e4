#!/usr/bin/env bash
# scripts/bench/scaling and scripts/bench/accuracy_curves on 1 and 2 ranks with tiny settings
# (fashion_mnist's MLP, a few steps): each writes its CSV, Markdown and PNG (and PDF) files,
# and the files parse: the CSV has a row per rank count with positive, finite numbers (and
# speed-up 1 at 1 rank), the pictures are images matplotlib reads back, the PDFs are PDFs.
# scripts/bench/scaling also runs the transformer (tiny, on scripts/make_demo_corpus' data;
# batches in tokens) on 1 and 2 ranks. The full series is a benchmark (docs/scaling.md), not
# this test.
#   test_bench_scripts.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1
build=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_bench_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
limit=${TNT_E2E_TIMEOUT:-240}
py=/usr/bin/python3
[[ -x $py ]] || py=python3

timeout -k 5 "$limit" "$src/scripts/bench/scaling" --build-dir "$build" --program fashion_mnist --ranks 1,2 \
  --repeats 2 --warmup 1 --steps 2 --micro-batch 16 --out "$tmp/scaling" -- --model=mlp \
  || fail "scripts/bench/scaling failed (status $?)"
timeout -k 5 60 "$src/scripts/make_demo_corpus" "$tmp/corpus" --convert >"$tmp/corpus.log" 2>&1 \
  || { cat "$tmp/corpus.log"; fail "scripts/make_demo_corpus failed (status $?)"; }
timeout -k 5 "$limit" "$src/scripts/bench/scaling" --build-dir "$build" --program transformer --ranks 1,2 \
  --repeats 1 --warmup 1 --steps 2 --micro-batch 384 --out "$tmp/transformer" -- --data_dir="$tmp/corpus/data" \
  --vocab_file="$tmp/corpus/data/vocab.ende.1000" --param_set=tiny --max_length=24 \
  || fail "scripts/bench/scaling --program transformer failed (status $?)"
timeout -k 5 "$limit" "$src/scripts/bench/accuracy_curves" --build-dir "$build" --ranks 1,2 --epochs 2 \
  --warmup-epochs 1 --out "$tmp/accuracy" -- --model=mlp --num_train_samples=512 \
  || fail "scripts/bench/accuracy_curves failed (status $?)"

"$py" - "$tmp" <<'EOF2' || fail "the output files do not check out"
import csv, math, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.image as mpimg
out = sys.argv[1]

def image(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", path + ": not a PNG"
    img = mpimg.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100, (path, img.shape)

def positive(row, *names):
    for n in names:
        v = float(row[n])
        assert math.isfinite(v) and v > 0, (n, row)

rows = list(csv.DictReader(open(os.path.join(out, "scaling", "scaling.csv"))))
assert [int(r["ranks"]) for r in rows] == [1, 2], rows
for r in rows:
    positive(r, "samples_per_s_mean", "step_ms_mean", "speedup", "efficiency")
    assert int(r["steps"]) == 4, r  # 2 repeats x 2 measured steps
    assert int(r["global_batch"]) == 16 * int(r["ranks"]), r
assert abs(float(rows[0]["speedup"]) - 1.0) < 1e-12, rows[0]
assert 0.0 <= float(rows[1]["hidden_fraction"]) <= 1.0, rows[1]
steps = list(csv.DictReader(open(os.path.join(out, "scaling", "scaling_steps.csv"))))
assert len(steps) == 8 and sorted({int(s["step"]) for s in steps}) == [2, 3], steps
md = open(os.path.join(out, "scaling", "scaling.md")).read()
assert md.count("\n| 1 | 16 |") == 1 and md.count("\n| 2 | 32 |") == 1, md
image(os.path.join(out, "scaling", "scaling.png"))
with open(os.path.join(out, "scaling", "scaling.pdf"), "rb") as f:
    assert f.read(5) == b"%PDF-", "scaling.pdf: not a PDF"

rows = list(csv.DictReader(open(os.path.join(out, "transformer", "scaling.csv"))))
assert [(r["program"], int(r["ranks"])) for r in rows] == [("transformer", 1), ("transformer", 2)], rows
for r in rows:
    positive(r, "samples_per_s_mean", "step_ms_mean", "speedup", "efficiency")
    assert int(r["steps"]) == 2 and int(r["global_batch"]) == 384 * int(r["ranks"]), r
md = open(os.path.join(out, "transformer", "scaling.md")).read()
assert "tokens/s" in md and "\n| 1 | 384 |" in md and "\n| 2 | 768 |" in md, md
image(os.path.join(out, "transformer", "scaling.png"))

acc = list(csv.DictReader(open(os.path.join(out, "accuracy", "accuracy.csv"))))
assert [(int(r["ranks"]), int(r["epoch"])) for r in acc] == [(1, 1), (1, 2), (2, 1), (2, 2)], acc
for r in acc:
    positive(r, "accuracy", "val_accuracy", "learning_rate")
    assert float(r["accuracy"]) <= 1 and float(r["val_accuracy"]) <= 1, r
# Linear scaling rule and 1 warmup epoch: at the end of epoch 1 the rate is short of its
# full value (still warming up); in epoch 2 it is lr * batch / 128 = 0.001 * ranks.
for r in acc:
    full = 0.001 * int(r["ranks"])
    if r["epoch"] == "1":
        assert 0 < float(r["learning_rate"]) < full, r
    else:
        assert abs(float(r["learning_rate"]) - full) <= 1e-6 * full, r
for name in ("accuracy_ranks1", "accuracy_ranks2", "accuracy_overlay"):
    image(os.path.join(out, "accuracy", name + ".png"))
    with open(os.path.join(out, "accuracy", name + ".pdf"), "rb") as f:
        assert f.read(5) == b"%PDF-", name
assert "| 2 | 256 |" in open(os.path.join(out, "accuracy", "accuracy.md")).read()
print("scaling and accuracy_curves outputs parse")
EOF2
echo PASS
