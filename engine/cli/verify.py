"""`python -m engine verify FILE`: replay a receipt (engine/receipts.py) and say whether it holds.

Exit status: 0 when the replay gives the receipt's tokens and logprob hash; 1 when it does not
(the first divergent token index, the shared prefix and the max |delta logprob| are printed);
2 when it cannot run: an unreadable or invalid receipt, a model that is not here (the line names
the model key), or a spec that loads another model here (another key: a replay could not check
this receipt, so it is not attempted). A receipt made in another environment (MLX, mlx-lm, BLAS,
platform) is replayed all the same, and the differences are printed next to the verdict.

A receipt a server's reply carried (`"verbatim": {"receipt": true}` in a chat completions, Responses
or Messages request) also records the request as its client sent it: it is read again by its wire
format and must give the receipt's request (a note says where it does not).

A receipt of a reply made on a Verbatim server (the window attached to one) names the server's
address as its model spec: the replay then runs on that server (engine/remote.py; `--api-key`
or $VERBATIM_API_KEY when it asks for one), after checking it still serves the receipt's model.
`--model http://host:port` points any receipt at a server.

The verdict goes to stdout (`--json`: one object), everything else to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from engine.errors import VerbatimError


def cmd_verify(args: argparse.Namespace) -> int:
    from engine.receipts import describe, open_engine, read, replay
    from engine.remote import is_server_address

    try:
        receipt = read(args.file)
        print(f"receipt: {describe(receipt)}", file=sys.stderr)
        spec = args.model or receipt.model.spec
        if is_server_address(spec):
            eng = open_server(receipt, spec, args.api_key or os.environ.get("VERBATIM_API_KEY"))
        else:
            eng = open_engine(receipt, args.model, args.cache_dir, use_disk=not args.no_cache)
    except VerbatimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    note = wire_note(receipt)
    if note:
        print(f"note: {note}", file=sys.stderr)
    try:
        verdict = replay(receipt, eng, use_cache=not args.no_cache)
    except VerbatimError as e:
        print(f"error: cannot replay: {e}", file=sys.stderr)
        return 2
    finally:
        eng.close()
    if args.json:
        print(json.dumps(verdict.to_dict()))
    else:
        print(verdict.line())
        for note in verdict.notes:
            print(f"note: {note}")
        if verdict.environment_diff:
            print("environment differs from the receipt's: " + "; ".join(verdict.environment_diff))
    return 0 if verdict.ok else 1


def wire_note(receipt: Any) -> str:
    """A receipt of a server's reply records the request as its client sent it (chat completions,
    Responses or Messages): read again by its wire format (engine/serve/formats/), it must give
    the receipt's request. What differs, in a line; "" when it agrees (or there is nothing to read:
    a Responses request that continues a stored response carries only its new input)."""
    if receipt.wire is None:
        return ""
    from dataclasses import replace

    from engine.serve.formats import chat, messages, responses
    from engine.serve.schema import APIError, Defaults
    from engine.types import validate_messages

    api, body = receipt.wire["api"], receipt.wire["request"]
    parsers = {"chat.completions": chat.parse_chat, "completions": chat.parse_completion,
               "responses": responses.parse, "messages": messages.parse}
    if api not in parsers:
        return f"the receipt records a request of an unknown API {api!r}: replaying its recorded request"
    try:
        # the template options the receipt's model took are the ones its template reads
        reads = tuple(name for name, _ in receipt.template_options)
        parsed = parsers[api](body, Defaults(receipt.mode, receipt.sampler.seed, reads))
    except APIError as e:
        return f"the recorded {api} request does not read here ({e.message}): replaying its recorded request"
    if getattr(parsed, "previous", None):
        return ""
    req = parsed.request
    same = ((receipt.prompt is not None and req.prompt == receipt.prompt)
            or (req.messages and validate_messages(req.messages) == receipt.messages))
    same = bool(same) and req.constraint == receipt.constraint and tuple(req.stop) == receipt.stop \
        and replace(req.sampler, seed=receipt.sampler.seed) == receipt.sampler \
        and req.template_options == receipt.template_options
    return "" if same else f"the recorded {api} request reads as another request here: replaying the receipt's"


def open_server(receipt: Any, url: str, api_key: Any) -> Any:
    """The server at `url` as the replay's engine, if it serves the receipt's model."""
    from engine.receipts import ReceiptError
    from engine.remote import connect

    try:
        eng = connect(url, api_key)
    except VerbatimError as e:
        raise ReceiptError(f"the receipt's server {url} is not usable: {e}") from None
    assert eng.info is not None
    if eng.info.key != receipt.model.key:
        raise ReceiptError(f"the server at {url} serves another model now (key {eng.info.key}, the receipt's "
                           f"is {receipt.model.key}); a replay would not check this receipt")
    print(f"replaying on {eng.describe()}", file=sys.stderr)
    return eng


def add_verify_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("verify", help="replay a receipt: exit 0 if it matches, 1 if not, 2 if it cannot run")
    p.add_argument("file", type=Path, metavar="FILE", help="a receipt (generate --receipt, or the app's Export receipt)")
    p.add_argument("--model", help="load the model from here instead of the receipt's spec (the key must match); "
                   "a server's address (http://host:port) replays there")
    p.add_argument("--api-key", help="the server's API key, for a replay on a server (or $VERBATIM_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cache-dir", type=Path, help="prompt cache directory (default: the user cache dir)")
    g.add_argument("--no-cache", action="store_true", help="a cold run: neither look up nor store")
    p.set_defaults(func=cmd_verify)
