"""Compares two runs of bench_bf16_backward.py kernel by kernel: A and B,
each the benchmark's JSON (`{"meta", "cases"}`), the `bench.json` that
scripts/device.sh writes (a list of benchmark runs, one of them
bench_bf16_backward.py's), or FILE#KEY for one of several runs in a file. For every shape, backend (kernels_us: each
backend's default structure; kernels_us_key_outer: the opt-in ones) and
kernel named in both runs: A's and B's device time (us, torch.profiler) and
B / A; then each backend's end-to-end op time (ms, CUDA events) and its
ratio to cuDNN's in each run, since cuDNN's own time moves between runs.

Kernel times move by about 1% between H200 machines, end-to-end times by
more (cuDNN's by up to 15%): compare two versions inside one device call
(scripts/device-ab.sh) and read the kernel table first.

  python3 scripts/compare_kernel_runs.py A.json B.json [--labels A,B] [--markdown F]
  python3 scripts/compare_kernel_runs.py R.json#overlap_91caeb2 R.json#final_949611a
"""

import argparse
import json
import sys
from pathlib import Path


def bench_cases(spec):
    """The cases of bench_bf16_backward.py's results in `spec`: a path, or
    PATH#KEY for the results under one key of a file that holds several
    (bench/results/bench_bf16_backward-overlap-h200-2026-12-03.json)."""
    path, _, key = spec.partition("#")
    data = json.loads(Path(path).read_text())
    if key:
        if not isinstance(data, dict) or key not in data:
            known = ", ".join(data) if isinstance(data, dict) else "none: not an object"
            raise SystemExit(f"{path}: no key {key!r} (keys: {known})")
        data = data[key]
    if isinstance(data, list):  # device.sh's bench.json
        for run in data:
            for name, result in (run.get("results") or {}).items():
                if name.startswith("bench_bf16_backward") and "cases" in result:
                    return result["cases"]
        raise SystemExit(f"{path}: no bench_bf16_backward.py results among its {len(data)} benchmark runs")
    if "cases" in data:
        return data["cases"]
    raise SystemExit(f"{path}: neither bench_bf16_backward.py's JSON nor device.sh's bench.json")


def paired_cases(cases_a, cases_b):
    """(A's case, B's case) for every shape both runs timed, in A's order."""
    by_shape_b = {c["shape"]: c for c in cases_b}
    return [(a, by_shape_b[a["shape"]]) for a in cases_a if a["shape"] in by_shape_b]


def kernel_rows(cases_a, cases_b):
    """(shape, backend, kernel, us A, us B) for every kernel both runs timed."""
    rows = []
    for a, b in paired_cases(cases_a, cases_b):
        for table, suffix in (("kernels_us", ""), ("kernels_us_key_outer", " (key_outer)")):
            for backend, kernels_a in (a.get(table) or {}).items():
                kernels_b = (b.get(table) or {}).get(backend) or {}
                for kernel, us_a in kernels_a.items():
                    if kernel in kernels_b:
                        rows.append((a["shape"], backend + suffix, kernel, us_a, kernels_b[kernel]))
    return rows


def op_rows(cases_a, cases_b):
    """(shape, backend, ms A, ms B, A / cuDNN, B / cuDNN) for each gw backend both runs timed."""
    rows = []
    for a, b in paired_cases(cases_a, cases_b):
        cudnn_a, cudnn_b = a.get("sdpa_cudnn_ms"), b.get("sdpa_cudnn_ms")
        for key in a:
            if key.startswith("gw_") and key.endswith("_ms") and isinstance(a[key], (int, float)) \
                    and isinstance(b.get(key), (int, float)):
                rows.append((a["shape"], key[3:-3], a[key], b[key],
                             a[key] / cudnn_a if cudnn_a else None, b[key] / cudnn_b if cudnn_b else None))
    return rows


def cudnn_rows(cases_a, cases_b):
    """(shape, A's cuDNN ms, A's again, B's, B's again) per shape both runs
    timed: cuDNN's backward is every ratio's denominator, and its time moves
    between processes far more than the project's kernels do ("again": timed
    a second time after the project's backends, where the run has it)."""
    return [(a["shape"], a.get("sdpa_cudnn_ms"), a.get("sdpa_cudnn_again_ms"), b.get("sdpa_cudnn_ms"),
             b.get("sdpa_cudnn_again_ms")) for a, b in paired_cases(cases_a, cases_b)]


def markdown(cases_a, cases_b, label_a, label_b):
    def ratio(x):
        return "n/a" if x is None else f"{x:.2f}"

    lines = [f"Per kernel (us, profiler device time): {label_a} against {label_b}", "",
             f"| shape | backend | kernel | {label_a} | {label_b} | {label_b} / {label_a} |",
             "|---|---|---|---|---|---|"]
    for shape, backend, kernel, us_a, us_b in kernel_rows(cases_a, cases_b):
        lines.append(f"| {shape} | {backend} | {kernel} | {us_a:.1f} | {us_b:.1f} | {us_b / us_a:.3f} |")
    lines += ["", f"End to end (ms, CUDA events) and the ratio to cuDNN's backward of the same run", "",
              f"| shape | backend | {label_a} ms | {label_b} ms | {label_b} / {label_a} | "
              f"{label_a} / cuDNN | {label_b} / cuDNN |",
              "|---|---|---|---|---|---|---|"]
    for shape, backend, ms_a, ms_b, r_a, r_b in op_rows(cases_a, cases_b):
        lines.append(f"| {shape} | {backend} | {ms_a:.3f} | {ms_b:.3f} | {ms_b / ms_a:.3f} | {ratio(r_a)} | {ratio(r_b)} |")

    def ms(x):
        return "n/a" if x is None else f"{x:.3f}"

    lines += ["", "cuDNN's backward in each run (ms; the denominator above; again: timed after the project's "
              "backends of the shape, where the run did)", "",
              f"| shape | {label_a} | {label_a} again | {label_b} | {label_b} again | {label_b} / {label_a} |",
              "|---|---|---|---|---|---|"]
    for shape, c_a, again_a, c_b, again_b in cudnn_rows(cases_a, cases_b):
        lines.append(f"| {shape} | {ms(c_a)} | {ms(again_a)} | {ms(c_b)} | {ms(again_b)} | "
                     f"{'n/a' if not (c_a and c_b) else f'{c_b / c_a:.3f}'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--labels", default="A,B", help="two names for the runs, comma-separated")
    parser.add_argument("--markdown", default="", help="also write the tables to this file")
    args = parser.parse_args(argv)
    labels = args.labels.split(",")
    if len(labels) != 2 or not all(labels):
        parser.error("--labels takes two names, comma-separated")
    cases_a, cases_b = bench_cases(args.a), bench_cases(args.b)
    if not kernel_rows(cases_a, cases_b):
        raise SystemExit("the two runs share no shape, backend and kernel: nothing to compare")
    text = markdown(cases_a, cases_b, *labels)
    sys.stdout.write(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
