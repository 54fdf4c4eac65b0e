"""python -m gaugewatch_hooks --check [--json]: see gaugewatch_hooks/check.py."""

import argparse
import sys

from gaugewatch_hooks import check


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gaugewatch_hooks",
        description="The Python helper of libgaugewatch_hooks. --check says which library it finds, "
                    "what is loaded and what would be monitored on this machine.")
    parser.add_argument("--check", action="store_true", required=True,
                        help="report the library, versions, intercepted SDPA ops and the agent socket")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    return check.main(as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
