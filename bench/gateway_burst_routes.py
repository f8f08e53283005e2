"""Gateway CPU per request on the engines' own token routes: SGLang's `/generate` and vLLM's `/inference/v1/generate` against `/v1/completions`, in one run (the target: within 1.1x).

One trioforward gateway in front of two instant simulated engines, one of kind `sglang` and one vLLM with `--enable-scale-out`, so each token route has its engine (`/v1/completions` goes to both). Each route is a row of gateway_burst's load generator (a warm-up burst, then bursts until `--min-requests`; CPU = the gateway process's utime + stime per request), three rounds in alternating order (A B C, C B A, A B C); the median of the three rounds is reported with its ratio to `/v1/completions` at the same size. Bodies: the same 4-token prompt and a 4-token budget on each route.

    python bench/gateway_burst_routes.py --sizes 256,1024 --min-requests 4096

The same run as `python bench/gateway_burst.py --routes`; writes
``bench/results/gateway_burst_routes.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings, run as a script

try:
    import _token_routes as token_routes
except ImportError:
    from bench import _token_routes as token_routes  # type: ignore[no-redef]


def format_table(document: dict[str, Any]) -> str:
    """The medians of the rounds, each round, and the ratio to ``/v1/completions``."""
    lines = [
        "| route | burst size | errors | CPU µs / request (median of 3) | rounds (µs) | × /v1/completions |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for row in document.get("summary", []):
        rounds = ", ".join(f"{r:.0f}" for r in row["rounds_us"])
        ratio = row["ratio_to_completions"]
        lines.append(
            f"| `{row['route']}` | {row['size']} | {row['errors']} | {row['cpu_per_request_us']:.0f} | "
            f"{rounds} | {'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="256,1024", help="comma-separated burst sizes")
    parser.add_argument("--min-requests", type=int, default=4096, help="requests per row at least")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    return token_routes.main(sizes, 2, args.min_requests)


if __name__ == "__main__":
    main()
