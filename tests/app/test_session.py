"""The chat logic behind the window, without Qt: what the GUI does, a test does through engine APIs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from app.core.conversation.markdown import render
from app.core.conversation.model import read_path
from app.core.store import ChatSettings
from app.core.store.session import ChatSession, ModelIdentity, ReplyMaker, title_from
from app.core.store import ConversationStore, ReplyOutcome
from app.core.conversation.view_models import identity_text
from engine.engine import Engine
from engine.types import Comparison, SamplerSettings


def run(session: ChatSession, engine: Engine, pending):
    return session.finish(pending, engine.generate(pending.request)).message


def settings(**kw) -> ChatSettings:
    return ChatSettings(sampler=SamplerSettings(temperature=0.9, max_tokens=16), **kw)


def test_send_regenerate_variant_edit_without_qt(session_engine) -> None:
    session, engine = session_engine
    conv = session.new_conversation(settings(system_prompt="Be brief."))
    p1 = session.begin_send(conv, "Why is the sky blue?", ReplyMaker("tiny"))
    assert session.store.get_message(p1.reply_id).status == "generating"  # saved before generating
    assert p1.request.messages[0] == {"role": "system", "content": "Be brief."}
    first = run(session, engine, p1)
    assert first.status == "complete" and first.tokens and first.model_name == "tiny"
    assert session.store.get_conversation(conv).title == "Why is the sky blue?"

    # Regenerate reproduces the reply: no copy is added, the existing variant stays (and is active).
    p2 = session.begin_regenerate(first.id)
    result = engine.generate(p2.request)
    saved = session.finish(p2, result)
    again = saved.message
    assert again.id == first.id and saved.duplicate_of == first.id
    assert result.tokens == first.tokens and result.logprobs == first.logprobs
    outcome = saved.outcome
    assert outcome.comparison.identical is True and outcome.action == "regenerate" and outcome.previous_id == first.id
    assert result.report.restored == result.report.prompt_tokens - 1
    assert [vm.id for vm in read_path(session, conv)][-1] == first.id and read_path(session, conv)[-1].navigator == "1 / 1"

    variant = run(session, engine, session.begin_regenerate(first.id, fresh=True))
    assert variant.seed != first.seed and variant.outcome.action == "variant"
    assert variant.outcome.comparison is None  # a new seed is not compared ("new seed")
    view = read_path(session, conv)
    assert [vm.role for vm in view] == ["user", "assistant"]
    assert view[-1].navigator == "2 / 2" and view[-1].prev_id == first.id
    assert view[-1].identity == "new seed" and view[-1].badge_state == "info"

    edited = session.begin_edit(p1.user_id, "What is Rome?")
    reply = run(session, engine, edited)
    view = read_path(session, conv)
    assert view[0].content == "What is Rome?" and view[0].navigator == "2 / 2" and view[1].id == reply.id
    session.store.set_active(p1.user_id)
    assert [vm.id for vm in read_path(session, conv)][0] == p1.user_id


def test_verify_inputs_reproduce_the_reply_cold(session_engine, tiny_model: Path) -> None:
    """A warm reply (a regenerate that provably restored prompt - 1) is verified against a cold run."""
    session, engine = session_engine
    conv = session.new_conversation(settings())
    reply = run(session, engine, session.begin_send(conv, "The capital of France is"))
    pending = session.begin_regenerate(reply.id)
    result = engine.generate(pending.request)
    again = session.finish(pending, result).message
    assert 0 < result.report.restored == result.report.prompt_tokens - 1
    request, tokens, logprobs = session.verify_inputs(again.id)
    assert (tokens, logprobs) == (result.tokens, result.logprobs)  # what the store kept, bit for bit
    from dataclasses import replace

    from engine.types import CacheReport, GenerationResult

    stored = GenerationResult("", tokens, logprobs, "stop", request.sampler.seed, [], CacheReport())
    assert engine.verify(request, stored).identical
    other = Engine(use_disk=False, chunk=16)  # an independent cold run, in another engine
    other.load(str(tiny_model))
    cold = other.generate(replace(request, use_cache=False))
    assert cold.report.restored == 0 and (cold.tokens, cold.logprobs) == (tokens, logprobs)


def test_failed_generation_keeps_the_users_message(session_engine) -> None:
    session, _ = session_engine
    conv = session.new_conversation(settings())
    p = session.begin_send(conv, "hello")
    session.fail(p)
    assert [m.role for m in session.store.active_path(conv)] == ["user"]
    retry = session.begin_reply_to(p.user_id)
    assert retry.request.messages[-1] == {"role": "user", "content": "hello"}


def test_settings_round_trip_and_labels() -> None:
    s = ChatSettings(system_prompt="x", sampler=SamplerSettings(temperature=0.3, seed=7), random_seed=False, mode="fast")
    assert ChatSettings.from_dict(s.to_dict()) == s
    assert ChatSettings.from_dict({"mode": "bogus", "sampler": "nope"}) == ChatSettings()
    assert s.seed_for_new_reply() == 7
    assert title_from("  a\nlong   question " * 10).endswith("…")
    assert identity_text(ReplyOutcome(comparison=Comparison(True))) == "identical to previous"
    assert identity_text(ReplyOutcome(comparison=Comparison(False, 3))) == "differs from previous at token 3"
    assert identity_text(ReplyOutcome()) == ""
    # Stored rows keep the flat JSON layout they always had, and come back typed.
    row = {"action": "regenerate", "previous_id": 4, "identical": False, "first_diff": 3, "max_logprob_diff": 0.5}
    assert ReplyOutcome.from_dict(row).to_dict() == row and ReplyOutcome.from_dict(None) == ReplyOutcome()


def test_footer_shows_the_latest_run_and_every_run_is_kept(session_engine) -> None:
    session, engine = session_engine
    conv = session.new_conversation(settings())
    reply = run(session, engine, session.begin_send(conv, "hi"))
    vm = read_path(session, conv)[-1]
    assert vm.footer.startswith(f"{len(reply.tokens)} token") and "TTFT" in vm.footer
    assert "cache: restored 0 / " in vm.footer and len(vm.runs) == 1
    # A regenerate identical to it adds no message, only a run, with its own report: the footer
    # shows that run (restored all but the last prompt token, from memory), the first stays listed.
    again = session.begin_regenerate(reply.id)
    result = engine.generate(again.request)
    saved = session.finish(again, result)
    vm = read_path(session, conv)[-1]
    assert vm.id == reply.id and [r.report.restored for r in vm.runs] == [0, result.report.prompt_tokens - 1]
    assert vm.footer.startswith("run 2 of 2 · ") and f"cache: restored {result.report.prompt_tokens - 1} / " in vm.footer
    assert "(memory)" in vm.footer and vm.run_lines[0].startswith("run 1 of 2 · ")
    assert vm.report.restored == result.report.prompt_tokens - 1 and vm.outcome.duplicate_of == reply.id
    assert saved.run.message_id == reply.id and vm.runs[-1].id == saved.run.id
    assert "Regenerate (Ctrl+R) repeats this reply's own settings" in vm.settings_note
    # The engine's "identical to the last reply of the same prompt" and the session's comparison
    # are kept apart in a run (in the message's JSON column they share the key "identical").
    assert vm.runs[-1].report.identical is True and vm.runs[-1].outcome.comparison.identical is True
    assert vm.runs[0].report.identical is None and vm.runs[0].outcome.comparison is None
    # The runs live in the store: a reopened store shows the same.
    assert [r.id for r in session.store.runs(conv)[reply.id]] == [r.id for r in vm.runs]
    session.delete_message(reply.id)  # and go with their reply
    assert session.store.runs(conv) == {}


def test_a_reply_cut_short_keeps_its_tokens_across_a_crash(session_engine, tmp_path: Path) -> None:
    """What a crash (kill -9) mid-reply leaves: the text and tokens of the last partial save. The
    reopened store marks it interrupted; it can be verified, receipted and compared with its
    regenerate (over the shared length)."""
    session, engine = session_engine
    conv = session.new_conversation(settings())
    pending = session.begin_send(conv, "Tell me a story.", ReplyMaker(key=engine.info.key, chunk=engine.chunk))
    full = engine.generate(pending.request)
    cut = 5
    text = "".join(engine.token_texts(full.tokens[:cut]))
    session.save_partial(pending, text, full.tokens[:cut], full.logprobs[:cut])
    path = session.store.path
    session.store.close()  # the process dies here: nothing else is written
    session = ChatSession(ConversationStore(path))
    m = session.message(pending.reply_id)
    assert m.status == "interrupted" and m.tokens == full.tokens[:cut] and m.logprobs == full.logprobs[:cut]
    vm = read_path(session, conv)[-1]
    assert vm.tokens == cut and vm.footer == f"{cut} tokens · stopped (not finished)" and vm.runs == ()
    request, tokens, _ = session.verify_inputs(m.id)  # a cold run reproduces the part it got
    assert tokens == full.tokens[:cut] and request.sampler.max_tokens == cut and request.mode == "exact"
    assert engine.verify(request, engine.generate(request)).identical
    receipt = session.receipt(m.id, ModelIdentity(str(engine.info.path), engine.info.key))
    assert receipt.tokens == full.tokens[:cut] and receipt.chunk == engine.chunk and receipt.model.key == engine.info.key
    # Its regenerate uses its seed and compares over the shared length: identical up to the cut.
    again = session.begin_regenerate(m.id)
    assert again.request.sampler.seed == m.seed
    result = engine.generate(again.request)
    saved = session.finish(again, result)
    assert saved.outcome.comparison.identical and saved.outcome.comparison.upto == cut
    session.close()


def test_markdown_is_safe_and_highlighted() -> None:
    r = render(
        "<script>alert(1)</script> [x](javascript:alert(1)) [ok](https://example.com) "
        "![pic](http://example.com/a.png) <img src=x onerror=y>\n\n```python\nx = '<b>'\n```\n"
    )
    assert "<script" not in r.html and "<img" not in r.html and "javascript:" not in r.html.split("[x]")[0]
    assert 'href="javascript' not in r.html and 'href="https://example.com"' in r.html
    assert "[image: pic]" in r.html
    assert r.code_blocks == ["x = '<b>'"] and 'href="copy:0"' in r.html
    assert "&lt;b&gt;" in r.html and "style=" in r.html  # highlighted with inline styles, escaped


def test_markdown_streaming_unclosed_fence() -> None:
    r = render("Here:\n```js\nlet a = 1", streaming=True)
    assert r.code_blocks == ["let a = 1"] and r.html.endswith("▍</span>")


def test_markdown_a_dangling_fence_is_text_not_an_empty_code_block() -> None:
    for text in ("Here:\n```", "Here:\n```python\n", "a\n```\n\n"):
        r = render(text)
        assert r.code_blocks == [] and "```" in r.html, text
    assert render("Here:\n```py\nx = 1").code_blocks == ["x = 1"]  # unclosed with code: still code
    assert render("Here:\n```", streaming=True).code_blocks == [""]  # being written: a block


def test_markdown_shows_tool_calls_as_calls_not_markup() -> None:
    """A reply made for an agent (imported or exported) carries its calls in the template's
    markup: shown as a labelled call with its arguments, and nothing raw."""
    text = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
            '</tool_call>\n<tool_call>\nnot json\n</tool_call>')
    r = render(text)
    assert "tool_call" not in r.html and "&lt;tool_call" not in r.html
    assert "Tool call:" in r.html and "get_weather" in r.html
    assert r.code_blocks == ['{\n  "city": "Paris",\n  "days": 2\n}', "not json"]
    assert render("no calls here").html == render("no calls here").html  # plain text unchanged


def _highlighted(html: str) -> list[bool]:
    """For each code block in rendered HTML: whether Pygments styled it."""
    return ["<span" in body for body in re.findall(r"<pre[^>]*>(.*?)</pre>", html, re.S)]


def test_markdown_streaming_highlights_complete_blocks_within_a_budget_then_everything() -> None:
    from app.core.conversation.markdown import STREAM_HIGHLIGHT_CHARS

    small = "x = 1\nprint(x)"
    big = "\n".join(f"value_{i} = compute({i}, key='k{i}')" for i in range(80))  # > the budget
    assert len(small) < STREAM_HIGHLIGHT_CHARS < len(big)
    text = f"One:\n```python\n{small}\n```\nTwo:\n```python\n{big}\n```\nThree:\n```python\n{small}\n```\nEnd."
    # The block being written streams plain; a complete one is coloured.
    open_block = text[: text.index(small) + 5]
    assert _highlighted(render(open_block, streaming=True).html) == [False]
    assert _highlighted(render(text[: text.index("Two:")], streaming=True).html) == [True]
    # Complete blocks beyond the budget stream plain; once the reply is complete all are coloured.
    assert _highlighted(render(text, streaming=True).html) == [True, False, False]
    assert _highlighted(render(text).html) == [True, True, True]
    # While streaming, a block changes at most once, from plain to coloured: never back.
    seen: list[bool] = []
    for n in range(1, len(text) + 1, 7):
        now = _highlighted(render(text[:n], streaming=True).html)
        assert all(now[i] or not was for i, was in enumerate(seen[: len(now)])), (n, seen, now)
        seen = now
    assert render(text, streaming=True).code_blocks == render(text).code_blocks == [small, big, small]


def test_chat_logic_does_not_import_qt() -> None:
    import subprocess

    code = (
        "import sys, app.core.ops, app.core.chat, app.core.conversation.markdown, app.core.engine_link.models; "
        "sys.exit(any(m.startswith('PySide6') for m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root)}).returncode == 0


def test_python_m_app_starts_and_closes_cleanly_on_sigint(tiny_model: Path, tmp_path: Path) -> None:
    """The real entry point (QApplication + qasync loop + window + worker), ended with Ctrl+C."""
    import os
    import signal
    import subprocess

    pytest.importorskip("PySide6")
    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "data"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--model", str(tiny_model), "--data-dir", str(data)],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        seen: list[str] = []
        for line in proc.stdout:  # type: ignore[union-attr]  # until the loop runs and the model is in
            seen.append(line)
            text = "".join(seen)
            if "ready: the window is shown" in text and "model loaded:" in text:
                break
        assert proc.poll() is None, "".join(seen)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        out = "".join(seen) + out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert (data / "settings.ini").is_file()  # geometry saved on the way out


def test_the_old_prompt_cache_moves_once_to_the_user_cache_folder(tmp_path: Path) -> None:
    from app.core.engine_link.cache_move import move_prompt_cache

    old, new = tmp_path / "data" / "cache", tmp_path / "user-cache" / "Verbatim" / "prompt-cache"
    assert move_prompt_cache(old, new) == "none"
    (old / "snapshots").mkdir(parents=True)
    (old / "snapshots" / "a.safetensors").write_bytes(b"x" * 10)
    assert move_prompt_cache(old, new) == "moved"
    assert not old.exists() and (new / "snapshots" / "a.safetensors").read_bytes() == b"x" * 10
    assert move_prompt_cache(old, new) == "none"  # once
    (old / "snapshots").mkdir(parents=True)  # an old copy again, the new one in use: left alone
    assert move_prompt_cache(old, new) == "kept" and old.is_dir()
    empty = tmp_path / "empty-target"
    empty.mkdir()
    assert move_prompt_cache(old, empty) == "moved" and (empty / "snapshots").is_dir()


def test_python_m_app_keeps_the_prompt_cache_in_the_user_cache_folder() -> None:
    """The README's path: platformdirs' user cache folder (engine.paths.prompt_cache_dir), with
    the default data folder; a --data-dir is self-contained."""
    pytest.importorskip("PySide6")
    from app.qt.main import cache_dir_for, parse_args
    from engine.paths import prompt_cache_dir

    assert cache_dir_for(parse_args([])) == prompt_cache_dir()
    assert cache_dir_for(parse_args(["--data-dir", "/tmp/d"])) is None  # the window: /tmp/d/cache
    assert cache_dir_for(parse_args(["--data-dir", "/tmp/d", "--cache-dir", "/tmp/c"])) == Path("/tmp/c")


def test_sending_is_one_commit(tmp_path: Path) -> None:
    """The first message of a new chat: conversation, message, title and the reply's row are one
    transaction (the GUI thread waits for one fsync, not three)."""
    store = ConversationStore(tmp_path / "db.sqlite3")
    session = ChatSession(store)
    commits: list[str] = []
    store._conn.set_trace_callback(lambda sql: sql.strip().upper() == "COMMIT" and commits.append(sql))
    pending = session.begin_send(None, "Hello there", ReplyMaker("model"), settings(system_prompt="Be brief."))
    assert len(commits) == 1
    assert session.title(pending.conversation_id) == "Hello there"
    assert [m.role for m in store.messages(pending.conversation_id)] == ["user", "assistant"]
    commits.clear()
    session.begin_send(pending.conversation_id, "And again", ReplyMaker("model"))
    assert len(commits) == 1
    store._conn.set_trace_callback(None)
    store.close()


CHILD = r"""
import sys
from app.core.generation.reply_recorder import ReplyRecorder
from app.core.store import ChatSettings
from app.core.store.session import ChatSession, ReplyMaker
from app.core.store import ConversationStore
from engine.engine import Engine
from engine.types import SamplerSettings

db, model = sys.argv[1], sys.argv[2]
session = ChatSession(ConversationStore(db))
engine = Engine(use_disk=False, chunk=16)
engine.load(model)
settings = ChatSettings(sampler=SamplerSettings(temperature=0.0, max_tokens=4000), random_seed=False)
conv = session.new_conversation(settings)
pending = session.begin_send(conv, "Tell me everything.", ReplyMaker(key=engine.info.key, chunk=engine.chunk))
recorder = ReplyRecorder(session, pending, every=0.0)  # save after every token
for event in engine.stream(pending.request):
    recorder(event)
    if len(recorder.tokens) == 6:
        print(pending.reply_id, flush=True)  # saved: kill me now
"""


def test_a_reply_killed_mid_stream_keeps_its_tokens(tiny_model: Path, tmp_path: Path) -> None:
    """A real process generating a reply, killed with SIGKILL mid-reply: what it had saved stays
    (text with its tokens), marked interrupted when the store is opened again."""
    import os
    import signal
    import subprocess

    db = tmp_path / "db.sqlite3"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(tiny_model)], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=root)
    try:
        reply_id = int(proc.stdout.readline())  # blocks until the child saved six tokens
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with ConversationStore(db) as store:
        m = store.get_message(reply_id)
        assert m.status == "interrupted" and len(m.tokens) >= 6 and len(m.logprobs) == len(m.tokens)
        assert m.content and m.cache_report["streamed"] and m.cache_report["chunk_size"] == 16
        session = ChatSession(store)
        request, tokens, _ = session.verify_inputs(reply_id)
        engine = Engine(use_disk=False, chunk=16)
        engine.load(str(tiny_model))
        cold = engine.cold_run(request)
        assert cold.tokens == tokens and cold.logprobs == m.logprobs  # what it saved is what it generated
        engine.close()
