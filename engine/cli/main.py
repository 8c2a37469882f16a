"""`python -m engine`: a headless front end to the engine.

`generate --json` is a stable contract for scripts and tests: one JSON object per
generation on stdout, in order. Errors a user can cause print one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

from engine.cli.models import add_subcommands
from engine.cli.serve import add_serve_parser
from engine.cli.verify import add_verify_parser
from engine.constraint import Constraint
from engine.documents.bounded import read_file
from engine.documents.document import Document, DocumentError, shown_name
from engine.errors import RequestError, VerbatimError
from engine.generate.loop import drain
from engine.types import (
    DEFAULT_CHUNK,
    Continuation,
    ContextPolicy,
    Event,
    GenerationRequest,
    GenerationResult,
    SamplerSettings,
    TokenEvent,
    validate_messages,
)


class CLIError(VerbatimError):
    """Bad command-line input (a missing or unreadable file, a bad option)."""


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="MLX model folder, .gguf file, or 'demo'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--mode", choices=("exact", "fast"), default="exact")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="prefill chunk size C")
    p.add_argument("--truncate", action="store_true",
                   help="when the conversation does not fit the model's context, leave out the oldest turns "
                        "(default: refuse with an error, before any prompt processing)")
    p.add_argument("--context-length", type=int, default=None,
                   help="use at most this many tokens of context (default: the model's own)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cache-dir", type=Path, help="prompt cache directory (default: the user cache dir)")
    g.add_argument("--no-cache", action="store_true", help="neither look up nor store")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Verbatim engine CLI")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate replies for conversation files")
    _add_sampler_args(g)
    g.add_argument("--messages", action="append", required=True, type=Path,
                   help="JSON file with a conversation: [{role, content}, ...], or an OpenAI chat request "
                        "{messages, tools, tool_choice, response_format} (repeatable)")
    g.add_argument("--attach", action="append", default=[], type=Path, metavar="FILE",
                   help="a document (text, Markdown, source, PDF, .docx) placed after the system prompt, its "
                        "state shared by every conversation about it (repeatable)")
    g.add_argument("--repeat", type=int, default=1, help="generate each conversation K times")
    g.add_argument("--json", action="store_true", help="one JSON object per generation on stdout")
    g.add_argument("--receipt", type=Path, metavar="FILE",
                   help="write a receipt (python -m engine verify FILE replays it); with several generations, "
                        "FILE-2, FILE-3... for the second and later")
    c = sub.add_parser("chat", help="interactive terminal chat (/regenerate, /continue, /new, /debug, /quit)")
    _add_sampler_args(c)
    c.add_argument("--system", default="", help="system prompt")
    c.add_argument("--attach", action="append", default=[], type=Path, metavar="FILE",
                   help="a document the conversation is about (repeatable)")
    add_subcommands(sub)
    add_serve_parser(sub)
    add_verify_parser(sub)
    return parser


def _sampler(args: argparse.Namespace) -> SamplerSettings:
    return SamplerSettings(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, seed=args.seed, max_tokens=args.max_tokens,
    )


def _policy(args: argparse.Namespace) -> ContextPolicy:
    return "truncate" if args.truncate else "refuse"


def _engine(args: argparse.Namespace) -> Any:
    from engine.engine import Engine

    if args.context_length is not None and args.context_length < 2:
        raise CLIError("--context-length must be at least 2")
    eng = Engine(cache_dir=args.cache_dir, use_disk=not args.no_cache, chunk=args.chunk,
                 context_length=args.context_length)
    eng.load(args.model, progress=lambda f, msg: print(f"[{f:4.0%}] {msg}", file=sys.stderr))
    return eng


def read_messages(path: Path) -> list[dict[str, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a BOM (Windows editors) is fine
    except FileNotFoundError:
        raise CLIError(f"messages file not found: {path}")
    except (OSError, UnicodeDecodeError) as e:
        raise CLIError(f"cannot read {path}: {e}")
    except json.JSONDecodeError as e:
        raise CLIError(f"{path} is not valid JSON: {e}")
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    try:
        return validate_messages(data)
    except RequestError as e:
        raise CLIError(f"{path}: {e}")


def read_constraint(path: Path) -> Optional[Constraint]:
    """A messages file written as an OpenAI chat request ({"messages": [...], "tools": [...],
    "tool_choice": ..., "response_format": ...}) also gives the tools and the output format
    (engine/constraint.py); a plain list of messages gives none."""
    data = json.loads(path.read_text(encoding="utf-8-sig"))  # read_messages checked it already
    if not isinstance(data, dict):
        return None
    try:
        return Constraint.of(data.get("tools"), data.get("tool_choice"), data.get("parallel_tool_calls"),
                             data.get("response_format"))
    except RequestError as e:
        raise CLIError(f"{path}: {e}")


def print_summary(result: GenerationResult) -> None:
    for w in result.report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(summary_line(result), file=sys.stderr)


def summary_line(result: GenerationResult) -> str:
    r = result.report
    same = "" if r.identical is None else ("  identical to previous" if r.identical else f"  DIFFERS at token {r.first_diff}")
    if r.continue_note:
        same += f"  ({r.continue_note})"
    for d in r.documents:
        same += f"  ({shown_name(d['name'])}: {d['tokens']} tokens, {d['source']})"
    if r.context is not None and r.context.dropped_messages:
        same += f"  ({r.context.dropped_messages} oldest messages left out to fit the context of {r.context.limit})"
    return (
        f"[{len(result.tokens)} tokens, {result.finish_reason}; cache {r.source or 'none'}: restored {r.restored}"
        f" / {r.stored if r.stored is not None else '-'} of {r.prompt_tokens} prompt tokens, prefilled {r.prefill_tokens};"
        f" ttft {r.ttft_s * 1000:.0f} ms, {r.decode_tps:.1f} tok/s{same}]"
    )


def debug_text(result: GenerationResult, stats: dict[str, Any]) -> str:
    """The debug panel, as text: what the cache did for the last reply."""
    r = result.report
    chunks = ", ".join(f"{a}-{b}" for a, b in r.chunks[:6]) + (" ..." if len(r.chunks) > 6 else "")
    # Consecutive layers that look alike are shown once ("0-29: KVCache ..."), as 30 lines help nobody.
    groups: list[tuple[int, int, str]] = []
    for l in r.layers:
        desc = (f"{l.cache_class} off={l.offset if l.offset is not None else '-'} size={l.size}"
                f"{'' if l.trimmable else ' (no trim)'}")
        if groups and groups[-1][2] == desc and groups[-1][1] == l.index - 1:
            groups[-1] = (groups[-1][0], l.index, desc)
        else:
            groups.append((l.index, l.index, desc))
    layers = "; ".join(f"{a}{'' if a == b else f'-{b}'}: {d}" for a, b, d in groups)
    lines = [
        f"prompt tokens {r.prompt_tokens}, matched {r.matched}, restored {r.restored} / stored "
        f"{r.stored if r.stored is not None else '-'}{' (partial)' if r.partial else ''}, source {r.source or 'none'}",
        f"mode {r.mode}, chunk {r.chunk_size}, seed {r.seed}, prefilled {r.prefill_tokens} in chunks {chunks}",
        f"layers after restore: {layers}",
        f"declines: {'; '.join(r.declines) if r.declines else 'none'}",
        "documents: " + ("; ".join(f"{shown_name(d['name'])} tokens {d['start']}-{d['end']} ({d['source']})"
                                   for d in r.documents)
                         or "none"),
        "stored: " + (", ".join(f"{s['kind']} {s['length']}" for s in r.snapshots_stored) or "nothing"),
        f"ttft {r.ttft_s * 1000:.0f} ms, prefill {r.prefill_tps:.1f} tok/s, decode {r.decode_tps:.1f} tok/s",
        "identical to previous: " + ("n/a" if r.identical is None else "yes" if r.identical else f"no (token {r.first_diff})"),
        "cache store: " + ", ".join(f"{k} {v}" for k, v in stats.items() if k != "disk"),
        "disk tier: " + (", ".join(f"{k} {v}" for k, v in stats["disk"].items()) if stats.get("disk") else "none"),
    ]
    return "\n".join(lines)


def read_attachments(paths: Sequence[Path]) -> tuple[Document, ...]:
    """The --attach files as documents, each read (within bounded.LOCAL's limits) and checked
    before the model loads."""
    try:
        return tuple(read_file(p) for p in paths)
    except DocumentError as e:
        raise CLIError(f"--attach {e}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    conversations = [(read_messages(p), read_constraint(p)) for p in args.messages]  # all checked before loading
    documents = read_attachments(args.attach)
    if args.repeat < 1:
        raise CLIError("--repeat must be at least 1")
    eng = _engine(args)
    n = 0
    try:
        for messages, constraint in conversations:
            for _ in range(args.repeat):
                req = GenerationRequest(messages, _sampler(args), mode=args.mode, use_cache=not args.no_cache,
                                        stop=tuple(args.stop), context_policy=_policy(args), constraint=constraint,
                                        documents=documents)
                result = eng.generate(req)
                n += 1
                if args.receipt is not None:
                    _write_receipt(args, eng, req, result, n)
                if args.json:
                    print(json.dumps(result.to_dict()), flush=True)
                else:
                    print(result.text, flush=True)
                    print_summary(result)
    finally:
        eng.close()
    return 0


def _write_receipt(args: argparse.Namespace, eng: Any, req: GenerationRequest, result: GenerationResult,
                   n: int) -> None:
    from engine.receipts import ReceiptModel, build, write

    path = args.receipt if n == 1 else args.receipt.with_name(f"{args.receipt.stem}-{n}{args.receipt.suffix}")
    info = eng.info
    spec = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model  # a folder, from anywhere
    model = ReceiptModel(spec, info.key, info.name, info.dequantized)
    try:
        write(build(req, result, model, eng.chunk), path)
    except OSError as e:
        raise CLIError(f"cannot write the receipt {path}: {e}")
    print(f"receipt written to {path}", file=sys.stderr)


def cmd_chat(args: argparse.Namespace) -> int:
    documents = read_attachments(args.attach)
    eng = _engine(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict[str, str]] = []
    last: Optional[tuple[GenerationRequest, GenerationResult]] = None
    print(f"Verbatim chat with {eng.info.name}. Commands: /regenerate /continue /new /debug /quit", file=sys.stderr)

    def run(req: GenerationRequest) -> GenerationResult:
        def show(e: Event) -> None:
            if isinstance(e, TokenEvent):
                print(e.text, end="", flush=True)

        events = eng.stream(req)
        try:
            result = drain(events, show)
        except KeyboardInterrupt:
            events.close()  # ends the generation where it stands; what it cached so far stays
            raise
        print()
        print_summary(result)
        return result

    try:
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            if line == "/new":
                history, last = [], None
                print("(new conversation)", file=sys.stderr)
                continue
            if line == "/debug":
                if last is None:
                    print("(nothing generated yet)", file=sys.stderr)
                else:
                    print(debug_text(last[1], eng.cache_stats()), file=sys.stderr)
                continue
            if line == "/continue":  # the last reply ended at max tokens: as many again, as if never cut
                if last is None or last[1].finish_reason != "length":
                    print("(the last reply did not end at max tokens: nothing to continue)", file=sys.stderr)
                    continue
                base, done = last
                req = replace(base, sampler=replace(base.sampler, max_tokens=len(done.tokens) + args.max_tokens))
                part = run(replace(req, continuation=Continuation(tuple(done.tokens), logprobs=tuple(done.logprobs))))
                result = replace(part, tokens=done.tokens + part.tokens, logprobs=done.logprobs + part.logprobs,
                                 text=done.text[: part.report.continued_chars] + part.text)
                history[-1] = {"role": "assistant", "content": result.text}
                last = (req, result)  # /regenerate now repeats the whole reply
                continue
            if line == "/regenerate":
                if last is None:
                    print("(nothing to regenerate)", file=sys.stderr)
                    continue
                history.pop()  # drop the reply being replaced
                req = last[0]
            else:
                history.append({"role": "user", "content": line})
                req = GenerationRequest(system + history, _sampler(args), mode=args.mode, use_cache=not args.no_cache,
                                        stop=tuple(args.stop), context_policy=_policy(args), documents=documents)
            result = run(req)
            history.append({"role": "assistant", "content": result.text})
            last = (req, result)
    except KeyboardInterrupt:
        print(file=sys.stderr)
    finally:
        eng.close()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"generate": cmd_generate, "chat": cmd_chat}
    handler = handlers.get(args.command) or getattr(args, "func", None)
    try:
        return int(handler(args) or 0)
    except VerbatimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
