"""Control tokens typed in a message are text, and token ids a request names exist (issue 36, item 8).

The chat template's own markers (<|im_start|>, <start_of_turn>, the tool template's <tool_call>)
stay control tokens; the same text inside a message's content (a user's, a tool result's, an
assistant's) is encoded as ordinary text, so nothing a web page or a tool wrote can open a turn.
Ordinary chats must encode exactly as before (their cached prompts stay valid): checked on a
corpus for the demo model (SmolLM2 GGUF), the real Gemma 3 270M and the tiny tool model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from engine.constraint import template_messages
from engine.generate.templating import MessageStarts, encode_contents_as_text, render_prompt, typed_markers
from tests.engine_helpers import FORGED
from tests.tool_fixtures import CLOCK, WEATHER
from tests.tiny_models import build_tool_model

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CORPUS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "  What is 2+2?\n"},
     {"role": "assistant", "content": " Quatre. "}, {"role": "user", "content": "And 3+3?"},
     {"role": "assistant", "content": "Six."}, {"role": "user", "content": "Merci !"}],
    [{"role": "user", "content": "Ünïcödé, 日本語, emoji 🙂, café\n\n\ttabs and    spaces"}],
    [{"role": "user", "content": "def add(a, b):\n    return a + b\n"},
     {"role": "assistant", "content": "```python\nprint(add(1, 2))\n```"},
     {"role": "user", "content": "x <| im_start |> <im_end> < | y </s> [INST] ok"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "Empty question?"},
     {"role": "user", "content": "Yes."}],
]
TOOL_CORPUS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18, "sky": "clear ☀"}'},
     {"role": "assistant", "content": "It is 18 °C and clear."}, {"role": "user", "content": "And the time?"}],
]
@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The three models' tokenizers (no weights loaded): name -> mlx-lm TokenizerWrapper."""
    from mlx_lm.utils import load_tokenizer

    from engine.errors import ModelError
    from engine.models.resolve import resolve_model

    folders: dict[str, Path] = {"tool": build_tool_model(tmp_path_factory.mktemp("models") / "qwen-tools")}
    for name in ("demo", "gemma3-270m"):
        try:
            folders[name] = resolve_model(name)
        except ModelError as e:  # not installed: CI must have them (scripts/venv.sh installs both)
            if os.environ.get("CI"):
                pytest.fail(f"{e}: CI must run the special-token tests on {name}")
    yield {name: load_tokenizer(Path(f)) for name, f in folders.items()}


def as_before(tok: Any, messages: list[dict[str, Any]], generation: bool = True, tools: Any = None) -> list[int]:
    """The encoding before issue 36: the template's text tokenized whole (markers anywhere)."""
    extra = {"tools": tools} if tools else {}
    ids = tok.apply_chat_template(template_messages(messages), add_generation_prompt=generation, tokenize=True, **extra)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids
    return [int(t) for t in ids]


def chats_for(name: str) -> list[tuple[list[dict[str, Any]], Any]]:
    out: list[tuple[list[dict[str, Any]], Any]] = [(c, None) for c in CORPUS]
    if name == "tool":
        out += [(c, [WEATHER, CLOCK]) for c in TOOL_CORPUS] + [(c, None) for c in TOOL_CORPUS[:1]]
    return out


def control_ids(tok: Any) -> set[int]:
    from engine.generate.templating import _markers

    markers = _markers(tok)
    assert markers is not None
    return set(markers.ids.values())


def test_ordinary_chats_encode_exactly_as_before(tokenizers: dict[str, Any]) -> None:
    """Token ids equal, with and without the generation prompt, for every model and chat, and
    also through the content-as-text encoder itself (a typed marker changes only its own tokens)."""
    assert {"tool", "demo", "gemma3-270m"} <= set(tokenizers) or not os.environ.get("CI")
    checked = 0
    for name, tok in tokenizers.items():
        for messages, tools in chats_for(name):
            assert not typed_markers(tok, messages), (name, messages)
            for generation in (True, False):
                want = as_before(tok, messages, generation, tools)
                assert render_prompt(tok, messages, generation, tools) == want, (name, messages)
                assert encode_contents_as_text(tok, messages, generation, tools) == want, (name, messages)
                checked += 1
    assert checked >= 2 * len(CORPUS)


@pytest.mark.parametrize("role", ["user", "tool", "assistant", "system"])
def test_a_typed_marker_is_encoded_as_text(tokenizers: dict[str, Any], role: str) -> None:
    for name, tok in tokenizers.items():
        plain = "hi, it is 18 degrees"
        before = [{"role": "user", "content": "Weather?"}]
        if role == "tool":
            before += [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
            if name != "tool":
                continue  # only the tool template renders tool results
        if role == "system":
            before = []
        tools = [WEATHER] if name == "tool" and role == "tool" else None
        after = [{"role": "user", "content": "Thanks."}] if role in ("assistant", "system") else []
        msg = {"role": role, "content": FORGED, **({"tool_call_id": "call_1"} if role == "tool" else {})}
        messages = before + [msg] + after
        clean = before + [{**msg, "content": plain}] + after
        assert typed_markers(tok, messages)
        ids = render_prompt(tok, messages, tools=tools)
        # Exactly the template's own control tokens: the same ones, in the same order, as for
        # the same chat with ordinary text in that message.
        controls = control_ids(tok)
        assert [t for t in ids if t in controls] == [t for t in as_before(tok, clean, tools=tools) if t in controls]
        # ... and the forged text is all there, as text: the decoded prompt is the template's.
        rendered = tok.apply_chat_template(template_messages(messages), add_generation_prompt=True, tokenize=False,
                                           **({"tools": tools} if tools else {}))
        assert tok._tokenizer.decode(ids, skip_special_tokens=False) == rendered, name
        # The old encoding did turn them into control tokens (what this guards against).
        assert [t for t in as_before(tok, messages, tools=tools) if t in controls] != \
            [t for t in ids if t in controls], name


def test_message_starts_follow_the_text_encoding(tokenizers: dict[str, Any]) -> None:
    """The cache's message cuts come from the same encoding, so a chat holding a typed marker
    still restores each earlier turn (its prefixes are prefixes of the prompt)."""
    tok = tokenizers["tool"]
    messages = [{"role": "user", "content": FORGED}, {"role": "assistant", "content": "Done <|im_end|>."},
                {"role": "user", "content": "Again."}]
    prompt = render_prompt(tok, messages)
    starts = MessageStarts(tok)(messages, prompt)
    assert len(starts) == len(messages)
    assert starts == [len(render_prompt(tok, messages[:i], add_generation_prompt=False)) for i in range(1, 4)]


def test_logit_bias_past_the_tokenizer_is_refused_by_name(tmp_path: Path) -> None:
    """The tool model's logits are 8 wider than its tokenizer: those ids decode to nothing, and
    /verbatim/tokenize refuses them; so does logit_bias (a 400 naming it), before any work."""
    from tests.engine_helpers import require_openblas
    from tests.server_helpers import Server, http

    require_openblas()
    s = Server(build_tool_model(tmp_path / "qwen-tools"), None)
    try:
        width = s.engine(lambda e: e.lm.model.args.vocab_size)
        named = s.engine(lambda e: len(e.lm.tokenizer._tokenizer))
        assert named < width
        def post(url: str, body: dict) -> Any:
            return http(url, json.dumps(body).encode(), {"Content-Type": "application/json"})

        for token in (named, width - 1, width):
            r = post(f"{s.url}/chat/completions", {
                "model": s.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "logit_bias": {str(token): 5}})
            assert r.status_code == 400, (token, r.body)
            err = r.json()["error"]
            assert err["param"] == "logit_bias" and "vocabulary" in err["message"] and len(err["message"]) <= 200
        ok = s.client().chat.completions.create(model=s.model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, logit_bias={str(named - 1): 5})
        assert ok.choices[0].finish_reason in ("stop", "length")
        base = s.url.removesuffix("/").removesuffix("/v1")
        assert post(f"{base}/verbatim/tokenize", {"tokens": [named]}).status_code == 400
        # The server's prompt for a typed marker: the template's control tokens only.
        ids = post(f"{base}/verbatim/tokenize", {"messages": [{"role": "user", "content": FORGED}]}).json()["ids"]
        tokenizer = s.engine(lambda e: e.lm.tokenizer)
        assert [t for t in ids if t in control_ids(tokenizer)] == [1, 2, 1]  # <|im_start|> <|im_end|> <|im_start|>
    finally:
        s.close()
