#!/usr/bin/env python3
"""Sorts compute-sanitizer racecheck reports (standard input: the output of
one racecheck run) into the two known artefacts of the tool and the rest.

Both are hazards that racecheck reports only when the warpgroups' pingpong
(bar.arrive / bar.sync on another barrier) runs beside a block barrier
that orders the accesses; tests/cuda/racecheck_pingpong_probe.cu reproduces
each on the pattern alone, with no kernel of ours (kernels/cuda/README.md,
"racecheck and the pingpong barrier"):
- the D = 64 dQ exchange: RAW hazards between the dQ partial stores of
  KeyTile::compute and their reads in KeyTile::add_dq_tile
  (kernels/cuda/bf16_keyouter_kernel.cuh); probe variants 1 and 2;
- the pair's pivot fix-up: hazards between the cp.async writes of the Hopper
  pair's dkdv loop (mma::cp_async_16, the next iteration's Q tile into the
  other buffer) and the fix-up's reads of the current Q tile
  (hopper::dkdv_kernel<64 or 128, kPivot>, its fix_up lambda,
  kernels/cuda/bf16_backward_hopper.cuh); probe variant 5 (the same double
  buffering with the pingpong) is reported, variant 6 (without) is not.

Exit status: 0 when every reported hazard is a known one (prints how many);
1 when any other hazard is reported (prints those); 2 when the input holds
no hazard report at all (nothing to classify: the caller keeps its status).
"""
import re
import sys

# One side of a hazard: "<Read|Write> access at <function>+<offset> in <file>:<line>".
SIDE = re.compile(r"(Read|Write) access at (.*?)\+0x[0-9a-f]+ in ([\w./-]+):(\d+)")
# KeyTile<64, P, kFirstThread[, kWriter = false]>: the template's signature
# before and after its writer-warp parameter (the writer runs only at D = 128),
# for every projection (bf16 0, gproj 1, pivot 2: the same dQ exchange).
KEYTILE_64 = r"KeyTile<\(int\)64, \(gaugewatch::gpu::Projection\)[012], \(int\)\d+(?:, \(bool\)0)?>"
KNOWN_READ = re.compile(KEYTILE_64 + r"::add_dq_tile(?:<\(int\)\d+>)?\(int(?:, int)?\) const$")
KNOWN_WRITE = re.compile(KEYTILE_64 + r"::compute<")
# The pair's pivot fix-up: cp.async writes, and reads in dkdv_kernel<64 or
# 128, kPivot>'s fix_up lambda (its only lambda taking (uint64_t, int)).
FIXUP_WRITE = re.compile(r"^gaugewatch::gpu::mma::cp_async_16\(")
FIXUP_READ = re.compile(r"hopper::dkdv_kernel<\(int\)(?:64|128), \(gaugewatch::gpu::Projection\)2>"
                        r"\(gaugewatch::gpu::bf16::Args\)::\[lambda\(unsigned long, int\) \(instance \d+\)\]")


def hazards(text):
    """Each report as (first side, [other sides]): a report starts with
    'Race reported between' and lists further sides on 'and ...' lines."""
    out = []
    for line in text.splitlines():
        side = SIDE.search(line)
        if "Race reported between" in line and side:
            out.append((side.groups(), []))
        elif out and side and line.lstrip("= ").startswith("and "):
            out[-1][1].append(side.groups())
    return out


def is_dq_exchange(first, others):
    kind, function, _, _ = first
    if kind != "Read" or not KNOWN_READ.search(function) or not others:
        return False
    return all(k == "Write" and KNOWN_WRITE.search(f) for k, f, _, _ in others)


def is_pivot_fixup(first, others):
    kind, function, _, _ = first
    if kind != "Write" or not FIXUP_WRITE.search(function) or not others:
        return False
    return all(k == "Read" and FIXUP_READ.search(f) for k, f, _, _ in others)


def is_known(first, others):
    return is_dq_exchange(first, others) or is_pivot_fixup(first, others)


def short(function):
    """A reported function without its return type and argument list, the
    first template's arguments kept and any later ones shown as <...>
    (lambdas and callbacks spell out the whole kernel), casts dropped:
    gaugewatch::gpu::bf16::keyouter::KeyTile<128, 2, 128, 1>::compute<...>."""
    if function.startswith("void "):
        function = function[len("void "):]
    out, depth, groups = [], 0, 0
    for ch in function:
        if ch == "(" and depth == 0:
            break
        if ch == "<":
            depth += 1
            if depth == 1:
                groups += 1
                out.append("<" if groups == 1 else "<...")
        elif ch == ">":
            if depth == 1:
                out.append(ch)
            depth -= 1
        elif depth == 0 or (depth == 1 and groups == 1):
            out.append(ch)
    return re.sub(r"\((?:int|bool|gaugewatch::gpu::Projection)\)", "", "".join(out))


def describe(side):
    kind, function, path, line = side
    return f"{kind} at {short(function)} ({path}:{line})"


def main():
    reports = hazards(sys.stdin.read())
    if not reports:
        print("racecheck_known: no hazard reports in the input")
        return 2
    unknown = [r for r in reports if not is_known(*r)]
    if unknown:
        print(f"racecheck_known: {len(unknown)} of {len(reports)} reports are not a known artefact (the D = 64 dQ "
              "exchange, the pair's pivot fix-up):")
        for first, others in unknown:
            print("  " + describe(first))
            for other in others:
                print("    and " + describe(other))
        return 1
    exchange = sum(is_dq_exchange(*r) for r in reports)
    print(f"racecheck_known: all {len(reports)} reports are known artefacts across the pingpong ({exchange} the "
          f"D = 64 dQ exchange, {len(reports) - exchange} the pair's pivot fix-up; kernels/cuda/README.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
