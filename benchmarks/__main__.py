"""``python -m benchmarks`` from the checkout: the side-by-side suite (what ``zqsync bench`` runs)."""

from __future__ import annotations

import argparse
import sys

from zqsync.cli import add_bench_arguments

from . import suite


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=suite.__doc__.split("\n\n")[0])
    add_bench_arguments(parser)
    args = parser.parse_args()
    size = "quick" if args.quick else "smoke" if args.smoke else "full"
    command = " ".join(["zqsync bench", *(["--" + size] if size != "full" else []),
                        *(f"--only {name}" for name in args.only or [])])
    return suite.run(size=size, only=args.only or (), json_path=args.json, plot_path=args.plot, command=command)


if __name__ == "__main__":
    sys.exit(main())
