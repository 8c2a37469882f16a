"""`python -m engine serve`: the local server from the command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from engine.serve.bridge import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_QUEUE_LIMIT
from engine.types import DEFAULT_CHUNK


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    p.add_argument("--model", required=True, help="MLX model folder, .gguf file, or 'demo'")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}; "
                   "any other than loopback needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--api-key", default=os.environ.get("VERBATIM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $VERBATIM_API_KEY)")
    p.add_argument("--queue-limit", type=int, default=DEFAULT_QUEUE_LIMIT,
                   help="requests waiting or running at most; more get 429")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="prefill chunk size C")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cache-dir", type=Path, help="prompt cache directory (default: the user cache dir)")
    g.add_argument("--no-cache", action="store_true", help="memory cache only (nothing on disk)")
    p.add_argument("--rank-timeout", type=float, default=120.0,
                   help="under mlx.launch: a rank that hears nothing from the others for this many seconds "
                        "exits non-zero (a peer is stuck)")
    h = p.add_mutually_exclusive_group()
    h.add_argument("--hosts", help="run across these hosts (comma-separated IPs) through mlx.launch")
    h.add_argument("--hostfile", help="run across the hosts of this mlx.launch hostfile")
    p.add_argument("--backend", default="ring", help="with --hosts/--hostfile: mlx.launch's backend (ring, jaccl)")
    p.add_argument("--ring-port", type=int, help="with --hosts/--hostfile: the first port of the ring")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.engine import Engine
    from engine.executor import EngineExecutor
    from engine.serve.schema import ServedModel
    from engine.serve.server import ServeError, check_bind, serve

    try:
        check_bind(args.host, args.api_key)  # before the minutes a model load can take
    except ServeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.queue_limit < 1:
        print("error: --queue-limit must be at least 1", file=sys.stderr)
        return 2
    # Started by mlx.launch on several ranks: one model across them (engine/distributed/).
    from engine.distributed.group import launched
    from engine.distributed.serve import maybe_serve_distributed

    if (args.hosts or args.hostfile) and not launched():  # start mlx.launch for the user
        from engine.distributed.launch import launch

        argv = sys.argv[sys.argv.index("serve") + 1:] if "serve" in sys.argv else []
        return launch(args.hosts, args.hostfile, args.backend, args.ring_port, argv)

    code = maybe_serve_distributed(args)
    if code is not None:
        return code
    executor = EngineExecutor(lambda: Engine(cache_dir=args.cache_dir, use_disk=not args.no_cache, chunk=args.chunk))
    try:
        progress = lambda f, msg: print(f"[{f:4.0%}] {msg}", file=sys.stderr)  # noqa: E731
        info = executor.submit(lambda eng: eng.load(args.model, progress=progress)).result()
        serve(executor, ServedModel.of(info, args.model), args.host, args.port, args.api_key, args.queue_limit)
    except ServeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        executor.shutdown()
    return 0
