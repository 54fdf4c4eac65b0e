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

A side may be several runs, comma-separated (device-ab.sh's rounds: A and
B in alternating processes): each time is then the median over that side's
runs, each ratio to cuDNN the median of the runs' own ratios (cuDNN of the
same process), and where both sides have the same number of runs a column
gives the range of B / A over the rounds (run i of A against run i of B).

  python3 scripts/compare_kernel_runs.py A.json B.json [--labels A,B] [--markdown F]
  python3 scripts/compare_kernel_runs.py R.json#overlap_91caeb2 R.json#final_949611a
  python3 scripts/compare_kernel_runs.py a1.json,a2.json,a3.json b1.json,b2.json,b3.json
"""

import argparse
import json
import statistics
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


def runs_of(specs):
    """The cases of each run in a comma-separated list of specs (bench_cases)."""
    return [bench_cases(spec) for spec in specs.split(",") if spec]


def shapes_in_both(runs_a, runs_b):
    """The shapes every run of both sides timed, in the first A run's order."""
    shapes = [c["shape"] for c in runs_a[0]]
    for cases in runs_a[1:] + runs_b:
        have = {c["shape"] for c in cases}
        shapes = [s for s in shapes if s in have]
    return shapes


def case(cases, shape):
    return next(c for c in cases if c["shape"] == shape)


def median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def kernel_times(c):
    """{(backend, kernel): us} of one case (kernels_us: each backend's default
    structure; kernels_us_key_outer: the opt-in ones, named with a suffix)."""
    times = {}
    for table, suffix in (("kernels_us", ""), ("kernels_us_key_outer", " (key_outer)")):
        for backend, kernels in (c.get(table) or {}).items():
            for kernel, us in kernels.items():
                times[(backend + suffix, kernel)] = us
    return times


def round_ratios(values_a, values_b):
    """B / A of each round (run i of A against run i of B), or [] where the
    sides' run counts differ or there is one round."""
    if len(values_a) != len(values_b) or len(values_a) < 2:
        return []
    return [b / a for a, b in zip(values_a, values_b) if a]


def kernel_rows(runs_a, runs_b):
    """(shape, backend, kernel, us A, us B, [B / A per round]) for every
    kernel every run timed; times are medians over each side's runs."""
    rows = []
    for shape in shapes_in_both(runs_a, runs_b):
        times_a = [kernel_times(case(cases, shape)) for cases in runs_a]
        times_b = [kernel_times(case(cases, shape)) for cases in runs_b]
        for key in times_a[0]:
            if not all(key in t for t in times_a + times_b):
                continue
            us_a, us_b = [t[key] for t in times_a], [t[key] for t in times_b]
            rows.append((shape, key[0], key[1], median(us_a), median(us_b), round_ratios(us_a, us_b)))
    return rows


def ratio_to_cudnn(c, key):
    cudnn = c.get("sdpa_cudnn_ms")
    return c[key] / cudnn if isinstance(c.get(key), (int, float)) and cudnn else None


def op_rows(runs_a, runs_b):
    """(shape, backend, ms A, ms B, A / cuDNN, B / cuDNN) for each gw backend
    every run timed: medians of the times, and of each run's own ratio."""
    rows = []
    for shape in shapes_in_both(runs_a, runs_b):
        cases = [case(cases, shape) for cases in runs_a + runs_b]
        for key in case(runs_a[0], shape):
            if not (key.startswith("gw_") and key.endswith("_ms")):
                continue
            if not all(isinstance(c.get(key), (int, float)) for c in cases):
                continue
            side_a, side_b = cases[:len(runs_a)], cases[len(runs_a):]
            rows.append((shape, key[3:-3], median([c[key] for c in side_a]), median([c[key] for c in side_b]),
                         median([ratio_to_cudnn(c, key) for c in side_a]),
                         median([ratio_to_cudnn(c, key) for c in side_b])))
    return rows


def cudnn_rows(runs_a, runs_b):
    """(shape, A's cuDNN ms, A's again, B's, B's again, [each run's cuDNN ms,
    A's then B's]) per shape: cuDNN's backward is every ratio's denominator,
    and its time moves between processes far more than the project's kernels
    do ("again": timed a second time after the project's backends, where the
    run has it); medians where a side has several runs."""
    rows = []
    for shape in shapes_in_both(runs_a, runs_b):
        side_a = [case(cases, shape) for cases in runs_a]
        side_b = [case(cases, shape) for cases in runs_b]
        rows.append((shape, median([c.get("sdpa_cudnn_ms") for c in side_a]),
                     median([c.get("sdpa_cudnn_again_ms") for c in side_a]),
                     median([c.get("sdpa_cudnn_ms") for c in side_b]),
                     median([c.get("sdpa_cudnn_again_ms") for c in side_b]),
                     [c.get("sdpa_cudnn_ms") for c in side_a + side_b]))
    return rows


def markdown(runs_a, runs_b, label_a, label_b):
    def ratio(x):
        return "n/a" if x is None else f"{x:.2f}"

    def ms(x):
        return "n/a" if x is None else f"{x:.3f}"

    several = len(runs_a) > 1 or len(runs_b) > 1
    paired = len(runs_a) == len(runs_b) > 1
    lines = []
    if several:
        lines += [f"{len(runs_a)} run(s) of {label_a}, {len(runs_b)} of {label_b}: medians over each side's runs"
                  + ("; rounds: B / A of each round (run i against run i), lowest and highest" if paired else ""),
                  ""]
    lines += [f"Per kernel (us, profiler device time): {label_a} against {label_b}", "",
              f"| shape | backend | kernel | {label_a} | {label_b} | {label_b} / {label_a} |"
              + (" rounds |" if paired else ""),
              "|---|---|---|---|---|---|" + ("---|" if paired else "")]
    for shape, backend, kernel, us_a, us_b, rounds in kernel_rows(runs_a, runs_b):
        spread = f" {min(rounds):.3f}-{max(rounds):.3f} |" if paired and rounds else (" n/a |" if paired else "")
        lines.append(f"| {shape} | {backend} | {kernel} | {us_a:.1f} | {us_b:.1f} | {us_b / us_a:.3f} |{spread}")
    lines += ["", "End to end (ms, CUDA events) and the ratio to cuDNN's backward of the same run"
              + (" (median of the runs' ratios)" if several else ""), "",
              f"| shape | backend | {label_a} ms | {label_b} ms | {label_b} / {label_a} | "
              f"{label_a} / cuDNN | {label_b} / cuDNN |",
              "|---|---|---|---|---|---|---|"]
    for shape, backend, ms_a, ms_b, r_a, r_b in op_rows(runs_a, runs_b):
        lines.append(f"| {shape} | {backend} | {ms_a:.3f} | {ms_b:.3f} | {ms_b / ms_a:.3f} | {ratio(r_a)} | {ratio(r_b)} |")

    lines += ["", "cuDNN's backward in each run (ms; the denominator above; again: timed after the project's "
              "backends of the shape, where the run did)", "",
              f"| shape | {label_a} | {label_a} again | {label_b} | {label_b} again | {label_b} / {label_a} |"
              + (" every run |" if several else ""),
              "|---|---|---|---|---|---|" + ("---|" if several else "")]
    for shape, c_a, again_a, c_b, again_b, each in cudnn_rows(runs_a, runs_b):
        every = (" " + " ".join(ms(x) for x in each) + " |") if several else ""
        lines.append(f"| {shape} | {ms(c_a)} | {ms(again_a)} | {ms(c_b)} | {ms(again_b)} | "
                     f"{'n/a' if not (c_a and c_b) else f'{c_b / c_a:.3f}'} |{every}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="A's run, or several comma-separated")
    parser.add_argument("b", help="B's run, or several comma-separated")
    parser.add_argument("--labels", default="A,B", help="two names for the runs, comma-separated")
    parser.add_argument("--markdown", default="", help="also write the tables to this file")
    args = parser.parse_args(argv)
    labels = args.labels.split(",")
    if len(labels) != 2 or not all(labels):
        parser.error("--labels takes two names, comma-separated")
    runs_a, runs_b = runs_of(args.a), runs_of(args.b)
    if not runs_a or not runs_b:
        parser.error("name at least one run on each side")
    if not kernel_rows(runs_a, runs_b):
        raise SystemExit("the runs share no shape, backend and kernel: nothing to compare")
    text = markdown(runs_a, runs_b, *labels)
    sys.stdout.write(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
