#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's SASS source page.

Reads the CSV that scripts/device-ncu-source.sh writes (ncu --page source
--print-source sass --csv: one row per SASS instruction with its warp-state
samples, in total and by stall reason) and prints the samples by reason and
the instructions that hold the most of them, each with its three largest
reasons:

  python3 scripts/ncu_source_summary.py .device/N/bf16_d64.csv --top 40
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if SAMPLES in r), None)
    if header_at is None:
        sys.exit(f"{path}: no '{SAMPLES}' column; is it ncu's SASS source page as CSV?")
    header = rows[header_at]
    return header, [r for r in rows[header_at + 1:] if len(r) == len(header)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30, help="instructions to list")
    args = parser.parse_args()
    header, rows = load(args.csv)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def count(row, name):
        text = row[col[name]].replace(",", "")
        return int(text) if text.strip().lstrip("-").isdigit() else 0

    total = sum(count(r, SAMPLES) for r in rows)
    if total == 0:
        sys.exit(f"{args.csv}: no samples")
    by_reason = collections.Counter()
    for r in rows:
        for name in reasons:
            by_reason[name] += count(r, name)
    print(f"{len(rows)} instructions, {total} samples")
    print("by reason: " + ", ".join(f"{k[len('stall_'):]} {100 * v / total:.1f}%"
                                     for k, v in by_reason.most_common(12) if v))
    print(f"\n| address | samples | executed | instruction | largest reasons |\n|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -count(r, SAMPLES))[:args.top]:
        top3 = sorted(((count(r, k), k[len("stall_"):]) for k in reasons), reverse=True)[:3]
        why = ", ".join(f"{name} {n}" for n, name in top3 if n)
        print(f"| {r[col['Address']][-5:]} | {100 * count(r, SAMPLES) / total:.2f}% | {count(r, EXECUTED)} "
              f"| `{r[col['Source']].strip()}` | {why} |")


if __name__ == "__main__":
    main()
