"""python -m samebits.check URL [options]: the same as `samebits check`."""
from __future__ import annotations

import argparse
import os
import sys

from samebits.check.config import APIS, EXPERIMENTS, CheckConfig
from samebits.check.constrained import CONSTRAINED
from samebits.check.runner import run

DEFAULTS = CheckConfig("http://defaults")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="samebits check", description=(
        "Is this OpenAI-compatible endpoint batch-invariant? Exit 0 clean, 1 variant, 2 could not test."))
    p.add_argument("url", help="the server root or its /v1, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model to request (default: the only one GET /v1/models lists)")
    p.add_argument("--api-key", default=os.environ.get("SAMEBITS_CHECK_API_KEY"),
                   help="bearer key (default: $SAMEBITS_CHECK_API_KEY, which keeps it out of the process list)")
    p.add_argument("--api", choices=APIS, default=DEFAULTS.api)
    p.add_argument("--experiments", type=_names, default=DEFAULTS.experiments,
                   help=f"comma-separated subset of {','.join(EXPERIMENTS)} (default: all)")
    p.add_argument("--concurrency", type=_ints, default=DEFAULTS.concurrency,
                   help="burst sizes for needle and sampled (default: %(default)s)")
    p.add_argument("--trials", type=int, default=DEFAULTS.trials, help="bursts per burst size")
    p.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens)
    p.add_argument("--needle-words", type=int, default=DEFAULTS.needle_words)
    p.add_argument("--filler-words", type=_ints, default=DEFAULTS.filler_words, help="MIN,MAX words per filler")
    p.add_argument("--prefix-words", type=int, default=DEFAULTS.prefix_words)
    p.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="for the sampled experiment")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--tolerance", type=float, default=DEFAULTS.tolerance,
                   help="accept |Δlogprob| up to this (default 0: exact; a non-zero value is reported as such)")
    p.add_argument("--max-requests", type=int, default=DEFAULTS.max_requests)
    p.add_argument("--max-wall-s", type=float, default=DEFAULTS.max_wall_s)
    p.add_argument("--request-timeout-s", type=float, default=DEFAULTS.request_timeout_s)
    p.add_argument("--constrained", choices=CONSTRAINED, default=DEFAULTS.constrained,
                   help="structured output on every request: json (response_format, a JSON schema) or mixed (vLLM's "
                        "structured_outputs: JSON schema, regex, choice or none, by prompt)")
    p.add_argument("--retries", type=int, default=DEFAULTS.retries, help="retries of a 429/503, with backoff")
    p.add_argument("--json", dest="json_path", help="write the report as JSON")
    p.add_argument("--html", dest="html_path", help="write a self-contained HTML report")
    p.add_argument("--compare", help="an earlier --json report: replay its references and compare")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    return run(args.pop("url"), **args)


if __name__ == "__main__":
    sys.exit(main())
