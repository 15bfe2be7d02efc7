"""Serve random weights of a benchmark shape over HTTP until interrupted, for `samebits check` on the GPU:

    python -m samebits.benchmarks.serve_random --random-shape 8b --mode deterministic --port 8000
    python -m samebits.check http://127.0.0.1:8000 --model bench --json r.json --html r.html

The model is built as server.py builds it (random N(0, 0.02) weights, the tiny test tokenizer), since an
8B checkpoint is too large to write for a test; the server is `samebits serve`'s app on uvicorn.
"""
from __future__ import annotations

import argparse

from samebits.benchmarks.server import SERVED_NAME, SHAPES, random_loaded


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--random-shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--mode", default="deterministic", choices=("deterministic", "fast"))
    p.add_argument("--device", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    args = p.parse_args(argv)

    import uvicorn

    from samebits.engine.async_engine import AsyncEngine
    from samebits.engine.llm_engine import LLMEngine
    from samebits.server.app import build_app
    from samebits.server.config import ServerConfig
    from samebits.server.serve import template, uvicorn_config

    config = ServerConfig.from_dict({"model": SERVED_NAME, "port": args.port, "mode": args.mode,
                                     "device": args.device, "max_num_seqs": args.max_num_seqs,
                                     "max_num_batched_tokens": args.max_num_batched_tokens, "log_level": "warning"})
    with template(config):
        loaded = random_loaded(args.random_shape, args.mode, args.device, None)
        engine = LLMEngine(config.engine.replace(model=f"random-{args.random_shape}"), loaded=loaded)
        app = build_app(AsyncEngine(engine, max_waiting=config.engine.max_waiting), config)
        uvicorn.Server(uvicorn_config(app, config)).run()


if __name__ == "__main__":
    main()
