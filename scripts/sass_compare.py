"""Compares two builds of CUDA kernels instruction by instruction: for every
kernel (mangled name) in both, whether its SASS is the same, with the two
instruction counts. A refactor that claims to leave kernels unchanged, or a
compile-time switch that claims to give each instantiation the code of a
measured build, is checked this way without a GPU: identical SASS runs in
identical time.

Inputs: object files or cubins (disassembled with cuobjdump -sass) or text
that cuobjdump -sass already wrote. Addresses and encodings are ignored;
opcodes, operands and predicates are compared.

  python3 scripts/sass_compare.py A.o B.o [--filter NAME] [--diff NAME]
Exit status: 0 when every kernel in both is the same, 1 when one differs or
is in one build only, 2 on a usage or tool error.
"""

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

FUNCTION = re.compile(r"Function : (\S+)")
INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*")


def find_cuobjdump():
    """cuobjdump on PATH, in the CUDA toolkit, or the one the triton wheel carries."""
    for candidate in (shutil.which("cuobjdump"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    try:
        import triton  # noqa: F401  (torch's dependency; its wheel carries the CUDA binutils)

        candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    except ImportError:
        pass
    return None


def sass_text(path):
    data = Path(path).read_bytes()
    if not data.startswith(b"\x7fELF"):
        return data.decode(errors="replace")
    tool = find_cuobjdump()
    if tool is None:
        raise SystemExit("sass_compare: cuobjdump not found (PATH, $CUDA_HOME/bin, or the triton wheel's); "
                         "give the output of cuobjdump -sass instead")
    out = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"sass_compare: cuobjdump -sass {path} failed: {out.stderr.strip()}")
    return out.stdout


def kernels(text):
    """{mangled name: [instruction, ...]}."""
    out, current = {}, None
    for line in text.splitlines():
        m = FUNCTION.search(line)
        if m:
            current = m.group(1)
            out[current] = []
            continue
        m = INSTRUCTION.match(line)
        if current is not None and m:
            out[current].append(m.group(1))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--filter", default="", help="only kernels whose mangled name contains this")
    parser.add_argument("--diff", default="", help="print a unified diff of the first kernel containing this")
    args = parser.parse_args(argv)
    a, b = kernels(sass_text(args.a)), kernels(sass_text(args.b))
    if not a or not b:
        print(f"sass_compare: no kernels in {args.a if not a else args.b}", file=sys.stderr)
        return 2
    names = sorted(n for n in set(a) | set(b) if args.filter in n)
    if not names:
        print(f"sass_compare: no kernel name contains {args.filter!r}", file=sys.stderr)
        return 2
    differ = 0
    for name in names:
        if name not in a or name not in b:
            print(f"only in {'A' if name in a else 'B'}: {name}")
            differ += 1
            continue
        same = a[name] == b[name]
        differ += not same
        print(f"{'same' if same else 'DIFF'} {len(a[name]):6d} {len(b[name]):6d} {name}")
    if args.diff:
        name = next((n for n in names if args.diff in n and n in a and n in b), None)
        if name is None:
            print(f"sass_compare: --diff {args.diff!r}: no kernel in both builds", file=sys.stderr)
            return 2
        sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(a[name], b[name], "A", "B", lineterm=""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
