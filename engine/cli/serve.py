"""`python -m engine serve`: the local server from the command line."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.serve import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_QUEUE_LIMIT, MAX_BODY
from engine.types import DEFAULT_CHUNK


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    p.add_argument("--model", required=True, help="MLX model folder, .gguf file, or 'demo'")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}; "
                   "any other than loopback needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--api-key", action="append", default=[],
                   help="require 'Authorization: Bearer KEY'; repeatable, each key its own prompt-cache "
                        "namespace (also $VERBATIM_API_KEY; visible in `ps`: prefer --api-keys-file)")
    p.add_argument("--api-keys-file", type=Path,
                   help="a file with one API key per line (each its own prompt-cache namespace)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                   help="let web pages from this origin (e.g. http://localhost:3000) call the server; "
                        "repeatable. Others are refused (403)")
    p.add_argument("--context-length", type=int, default=None,
                   help="use at most this many tokens of context, prompt + reply (default: the model's own)")
    p.add_argument("--mode", choices=("exact", "fast"), default="exact",
                   help="prompt-cache mode for requests that do not name one (default exact)")
    p.add_argument("--seed", type=_seed, default=None, metavar="N",
                   help="the seed of every request that names none (every Anthropic Messages request, most "
                        "harness requests): the same request gives the same reply, so a whole harness run "
                        "replays. Default: a fresh seed per request, reported in the reply's verbatim.seed")
    p.add_argument("--queue-limit", type=int, default=DEFAULT_QUEUE_LIMIT,
                   help="requests waiting or running at most; more get 429")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="prefill chunk size C")
    p.add_argument("--max-body-mb", type=_mebibytes, default=MAX_BODY >> 20, metavar="MB",
                   help=f"largest request body in MiB (default {MAX_BODY >> 20}; a file part's PDF is sent "
                        "base64-encoded: about 3/4 of this)")
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


def _api_keys(args: argparse.Namespace) -> list[str]:
    from engine.serve.keys import read_keys_file

    keys = list(args.api_key)
    env = os.environ.get("VERBATIM_API_KEY")
    if env:
        keys.append(env)
    if args.api_keys_file is not None:
        keys += read_keys_file(args.api_keys_file)
    return keys


def _seed(text: str) -> int:
    n = int(text)
    if not 0 <= n < 2**64:
        raise argparse.ArgumentTypeError("must be between 0 and 2**64 - 1")
    return n


def _mebibytes(text: str) -> int:
    n = int(text)
    if not 1 <= n <= 1024:
        raise argparse.ArgumentTypeError("must be between 1 and 1024")
    return n


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.engine import Engine
    from engine.executor import EngineExecutor
    from engine.serve.guard import normalize_origin
    from engine.serve.keys import KeyFileError
    from engine.serve.schema import ServedModel, template_reads
    from engine.serve.server import ServeError, check_bind, serve

    try:  # everything checked before the minutes a model load can take
        keys = _api_keys(args)
        check_bind(args.host, keys)
        for origin in args.allow_origin:
            normalize_origin(origin)
    except (ServeError, KeyFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.queue_limit < 1:
        print("error: --queue-limit must be at least 1", file=sys.stderr)
        return 2
    if args.context_length is not None and args.context_length < 2:
        print("error: --context-length must be at least 2", file=sys.stderr)
        return 2
    # Started by mlx.launch on several ranks: one model across them (engine/distributed/).
    from engine.distributed.group import launched
    from engine.distributed.serve import maybe_serve_distributed

    if (args.hosts or args.hostfile) and not launched():  # start mlx.launch for the user
        from engine.distributed.launch import launch

        argv = sys.argv[sys.argv.index("serve") + 1:] if "serve" in sys.argv else []
        return launch(args.hosts, args.hostfile, args.backend, args.ring_port, argv)

    code = maybe_serve_distributed(args, keys)
    if code is not None:
        return code
    executor = EngineExecutor(lambda: Engine(cache_dir=args.cache_dir, use_disk=not args.no_cache, chunk=args.chunk,
                                             context_length=args.context_length))
    try:
        progress = lambda f, msg: print(f"[{f:4.0%}] {msg}", file=sys.stderr)  # noqa: E731
        info = executor.submit(lambda eng: eng.load(args.model, progress=progress)).result()
        limit = executor.submit(lambda eng: eng.context_limit).result()
        # Every client's kept states (documents', harnesses' system turns; each API key's namespace):
        # disk -> memory, as they fit.
        preloaded = executor.submit(lambda eng: eng.preload_documents(every_namespace=True)).result()
        if preloaded:
            print(f"read {preloaded} kept states (documents, long system turns) from the prompt cache into memory",
                  file=sys.stderr)
        reads = executor.submit(lambda eng: template_reads(eng.lm.tokenizer)).result()  # reasoning_effort, ...
        model = replace(ServedModel.of(info, args.model), context_length=limit, chunk=args.chunk, template_reads=reads)
        serve(executor, model, args.host, args.port, keys, args.queue_limit,
              allow_origins=args.allow_origin, mode=args.mode, max_body=args.max_body_mb << 20, seed=args.seed)
    except ServeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        executor.shutdown()
    return 0
