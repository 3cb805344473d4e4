#!/usr/bin/env python3
"""scripts/bench/kernel_table.py without a GPU: a PyTorch-profiler-like Chrome trace becomes a
table (calls, totals, the busy union of overlapping kernels, copies by direction); tables
written and read back are the same; the comparison prints per-step numbers by category; a
file that is not a table is refused with its name and exit status 2.
    test_kernel_table.py SOURCE_DIR
"""
import io
import json
import os
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.join(sys.argv[1], "scripts", "bench"))
import kernel_table as kt  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def near(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(b))


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = kt.main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


with tempfile.TemporaryDirectory() as d:
    # Two steps: a GEMM of 100 us and a LayerNorm of 20 us a step, on two streams with the
    # LayerNorm inside the GEMM in step 2 (busy counts that time once), a copy, a memset,
    # and a CPU event that must not count.
    ev = [
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "layer_norm_forward_rows_kernel", "ts": 110.0, "dur": 20.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 200.0, "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "layer_norm_forward_rows_kernel", "ts": 250.0, "dur": 20.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 310.0, "dur": 5.0},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 320.0, "dur": 4.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 1000.0},
    ]
    trace = os.path.join(d, "trace.json")
    with open(trace, "w") as f:
        json.dump({"traceEvents": ev}, f)
    rows = kt.table_from_chrome_trace(trace)
    by = {(r["kind"], r["name"]): r for r in rows}
    check(near(by[("window", "window")]["total_us"], 324.0), f"window {by[('window', 'window')]}")
    check(near(by[("busy", "busy")]["total_us"], 100 + 20 + 100 + 5 + 4), f"busy {by[('busy', 'busy')]}")
    g = by.get(("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32"), {})
    check(g.get("calls") == 2 and near(g.get("total_us", 0), 200.0), f"gemm row {g}")
    check(by.get(("memcpy", "device to host"), {}).get("calls") == 1, "the copy is a device-to-host row")
    check(by.get(("memset", "memset"), {}).get("calls") == 1, "the memset row")
    check(not any(r["name"] == "aten::mm" for r in rows), "a CPU event counted")
    check([r["kind"] for r in rows[:2]] == ["window", "busy"], "summary rows first")

    ours = os.path.join(d, "ours.csv")
    kt.write_csv(rows, ours)
    back = kt.read_csv(ours)
    check([(r["kind"], r["name"], r["calls"]) for r in back] == [(r["kind"], r["name"], r["calls"]) for r in rows],
          "rows read back differ")
    check(not [f for f in os.listdir(d) if ".tmp" in f], "a temporary file was left")

    # Theirs: the same GEMM time, no LayerNorm kernel (fused away), one Triton kernel.
    theirs_rows = kt.rows_from_intervals([
        ("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 0.0, 100.0),
        ("kernel", "triton_per_fused_add_native_layer_norm_0", 100.0, 110.0),
        ("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 200.0, 300.0),
        ("kernel", "triton_per_fused_add_native_layer_norm_0", 300.0, 310.0),
    ])
    theirs = os.path.join(d, "theirs.csv")
    kt.write_csv(theirs_rows, theirs)
    rc, out, err = run([ours, "--steps", "2", "--against", theirs, "--top", "5"])
    check(rc == 0, f"comparison exit {rc}: {err}")
    lines = {}  # "label": [ours, theirs, difference] of the per-step table
    for ln in out.splitlines():
        parts = ln.split()
        if len(parts) >= 4 and all(p.lstrip("+-").replace(".", "", 1).isdigit() for p in parts[-3:]):
            lines[" ".join(parts[:-3])] = parts[-3:]
    gemm = lines.get("gemm")
    # 200 us over 2 steps = 0.100 ms a step on both sides.
    check(gemm == ["0.100", "0.100", "+0.000"], f"gemm line {gemm}")
    norm = lines.get("normalization")
    # Ours 40 us / 2 steps = 0.020 ms; theirs' fused LayerNorm kernels 20 us / 2 = 0.010 ms.
    check(norm == ["0.020", "0.010", "+0.010"], f"normalization line {norm}")
    idle = lines.get("GPU idle (window-busy)")
    # Ours: window 324 - busy 229 = 95 us over 2 steps; theirs: 310 - 220 = 90 us.
    check(idle == ["0.048", "0.045", "+0.003"], f"idle line {idle}")
    check("layer_norm_forward_rows_kernel" in out, "the top kernels list is missing")

    # GEMMs on a pre-Hopper kernel (a misaligned bf16 product): counted apart, listed with
    # their operand alignment; Hopper's own kernels are not.
    older_rows = kt.rows_from_intervals([
        ("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 0.0, 100.0),
        ("kernel", "cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_64x4_tn_align2", 100.0, 130.0),
        ("kernel", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", 130.0, 150.0),
        ("kernel", "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 150.0, 160.0),
    ])
    older = os.path.join(d, "older.csv")
    kt.write_csv(older_rows, older)
    rc, out, err = run([older, "--steps", "1", "--against", theirs, "--against-steps", "2"])
    check(rc == 0, f"older kernels: exit {rc}: {err}")
    got = [ln.split() for ln in out.splitlines() if ln.strip().startswith("on older kernels")]
    # gemm: 30 + 20 us = 0.050 ms of ours, none of theirs; convolution: 0.010 ms of ours.
    check([g[-3:] for g in got] == [["0.050", "0.000", "+0.050"], ["0.010", "0.000", "+0.010"]],
          f"older kernels lines {got}")
    check("[align 2]" in out and "built for GPUs before Hopper" in out, "the older kernels' list")
    check(not any("sm90_xmma_gemm" in ln for ln in out.split("before Hopper")[1].splitlines()[1:4]),
          "a Hopper kernel listed as older")
    check(kt.older_generation("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align2"),
          "cutlass_80 is older")
    check(not kt.older_generation("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNT"), "nvjet is Hopper's")
    check(not kt.older_generation("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), "sm90 is Hopper's")

    bad = os.path.join(d, "bad.csv")
    with open(bad, "w") as f:
        f.write("a,b\n1,2\n")
    rc, out, err = run([bad])
    check(rc == 2 and "bad.csv" in err and "not a kernel table" in err, f"bad table: exit {rc}, {err!r}")
    rc, out, err = run([ours, "--steps", "0"])
    check(rc == 2, f"--steps 0: exit {rc}")

    for name, cat in [("triton_red_fused__log_softmax_0", "softmax / loss"),
                      ("sm90_xmma_fprop_implicit_gemm_bf16bf16", "convolution"),
                      ("tnt::cuda::attention_fused_forward<64>", "attention"),
                      ("void tnt::cuda::map1_kernel<AddBias<bf16>>", "element-wise / other"),
                      ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication")]:
        check(kt.category("kernel", name) == cat, f"category of {name}: {kt.category('kernel', name)}, expected {cat}")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("kernel_table.py: all checks passed")
