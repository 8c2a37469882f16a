"""The chat without Qt (app/core/chat.py and its sub-models): a plain asyncio loop, a real Engine
on a tiny model on its executor thread. What a window sees, a test sees the same way: by
connecting to the sub-models' signals."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from app.core import ops
from app.core.chat import Chat
from app.core.store import ChatSettings
from engine.types import SamplerSettings
from tests.app.chat_helpers import TIMEOUT, close, load, make_chat, settings, wait_for


class Log:
    """Every signal of the chat's sub-models that a view binds to, in order, as (name, args)."""

    def __init__(self, chat: Chat) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []
        signals = {"path": chat.conversation.path_changed, "selected": chat.conversation.selected_changed,
                   "started": chat.generation.started, "ended": chat.generation.ended,
                   "streamed": chat.generation.streamed, "prefilled": chat.generation.prefilled,
                   "finished": chat.generation.finished, "error": chat.notices.error_raised,
                   "budget": chat.composer.budget_changed, "stats": chat.link.stats_changed}
        for name, signal in signals.items():
            signal.connect(lambda *args, name=name: self.events.append((name, args)))

    def names(self) -> list[str]:
        return [n for n, _ in self.events]

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [a for n, a in self.events if n == name]


def test_a_send_streams_in_batches_saves_and_selects_the_new_reply(chat: Chat) -> None:
    log = Log(chat)
    assert ops.send(chat, "Why is the sky blue?") and chat.generation.busy
    pending = chat.generation.pending
    assert [vm.role for vm in chat.conversation.vms] == ["user", "assistant"] and chat.conversation.selected.id == pending.reply_id
    (done,) = wait_for(chat, chat.generation.finished)
    result = done.result
    assert not chat.generation.busy and log.of("ended")[-1] == (pending,)
    texts = [text for rid, text, n in log.of("streamed")]
    assert texts and all(a == b[: len(a)] for a, b in zip(texts, texts[1:])) and texts[-1] == result.text
    assert len(texts) < len(result.tokens)  # batches, not one update per token
    names = log.names()
    assert names.index("started") < names.index("streamed") < names.index("finished")
    reply = chat.conversation.vms[-1]
    stored = chat.session.message(reply.id)
    assert reply.id == pending.reply_id and stored.status == "complete" and stored.tokens == result.tokens
    assert stored.logprobs == result.logprobs and chat.conversation.selected.id == reply.id and len(reply.runs) == 1
    assert log.of("selected")[-1][0].id == reply.id


def test_regenerate_acts_on_the_selected_reply(chat: Chat) -> None:
    ops.send(chat, "The capital of France is")
    wait_for(chat, chat.generation.finished)
    first = chat.conversation.vms[-1].id
    ops.send(chat, "And of Italy?")
    wait_for(chat, chat.generation.finished)
    second = chat.conversation.vms[-1].id
    ops.open_conversation(chat, chat.conversation.conv_id)  # reopened: nothing picked, the last reply is the selected one
    assert chat.conversation.selected_id is None and chat.conversation.selected.id == second
    chat.conversation.select(chat.conversation.vms[0].id)  # a user message: not a reply, ignored
    assert chat.conversation.selected.id == second
    chat.conversation.select(first)
    assert chat.conversation.selected.id == first
    assert ops.regenerate(chat)
    (done,) = wait_for(chat, chat.generation.finished)
    result = done.result
    assert done.pending.previous_id == first and done.saved.duplicate_of == first  # identical: a run of it
    assert [vm.id for vm in chat.conversation.vms if vm.role == "assistant"] == [first, second]
    runs = next(vm for vm in chat.conversation.vms if vm.id == first).runs
    assert len(runs) == 2 and runs[-1].report.restored == result.report.prompt_tokens - 1
    assert chat.conversation.selected.id == first


def test_stop_mid_stream_ends_with_the_result_and_keeps_the_tokens(tmp_path: Path, tiny_model: Path) -> None:
    c = make_chat(tmp_path, ChatSettings(sampler=SamplerSettings(temperature=0.0, max_tokens=3000)))
    load(c, tiny_model)
    ops.send(c, "Tell me a long story.")
    wait_for(c, c.generation.streamed)
    assert ops.stop(c)
    (done,) = wait_for(c, c.generation.finished)
    result = done.result
    stored = c.session.message(done.pending.reply_id)
    assert result.finish_reason == "cancelled" and 0 < len(result.tokens) < 3000
    assert stored.status == "interrupted" and stored.tokens == result.tokens and stored.content == result.text
    assert "stopped" in c.conversation.vms[-1].footer
    close(c)


def test_an_engine_error_is_told_and_the_message_kept(tmp_path: Path) -> None:
    c = make_chat(tmp_path)  # no model loaded
    log = Log(c)
    assert ops.send(c, "hello?")
    title, text = wait_for(c, c.notices.error_raised)
    assert title == "The reply could not be generated" and text.startswith("No model loaded")  # as a sentence
    assert not c.generation.busy and [vm.role for vm in c.conversation.vms] == ["user"]  # the empty placeholder went
    assert "finished" not in log.names()
    close(c)


def test_the_draft_is_counted_off_the_loop_with_the_limit_in_force(chat: Chat) -> None:
    ops.send(chat, "hi")
    wait_for(chat, chat.generation.finished)
    chat.session.set_settings(chat.conversation.conv_id, ChatSettings(context_length=1000))
    text = "a longer draft, typed on"
    chat.composer.type("a first")
    chat.composer.recount()
    chat.composer.type(text)
    chat.composer.recount()  # the latest count wins: only this text is told
    (budget,) = wait_for(chat, chat.composer.budget_changed, lambda b: b is not None and b.draft > 0)
    messages = chat.session.draft_messages(chat.conversation.conv_id, text, chat.conversation.settings())
    expected = chat.jobs.executor.submit(lambda e: len(e.prompt_ids(messages))).result(TIMEOUT)
    alone = chat.jobs.executor.submit(lambda e: len(e.prompt_ids(messages[-1:]))).result(TIMEOUT)
    assert budget.used == expected and budget.limit == 1000 and budget.draft == alone
    assert chat.composer.budget is budget and budget.fits and budget.warning == ""
    assert messages[-1] == {"role": "user", "content": text} and messages[-2]["role"] == "assistant"


SENTENCE = "The numbers went up and then down again, every quarter of every year. "


def test_a_send_whose_documents_cannot_fit_is_refused_before_anything_is_saved(chat: Chat, tmp_path: Path) -> None:
    ops.send(chat, "hi")
    wait_for(chat, chat.generation.finished)
    conv = chat.conversation.conv_id
    chat.session.set_settings(conv, ChatSettings(sampler=settings().sampler, context_length=400))
    chat.conversation.reload()
    before = [(m.id, m.content) for m in chat.session.store.messages(conv)]
    log = Log(chat)
    huge = tmp_path / "huge.txt"
    huge.write_text(SENTENCE * 30)  # longer than the conversation's 400 tokens, not than the model's context
    chat.composer.type("Summarise it")
    chat.composer.attach([str(huge)])
    assert chat.composer.attachments.reading == ("huge.txt",)
    # Sent while the file is still being read: it waits for the file and for the count of this draft.
    assert ops.send(chat) == ops.Changed.COMPOSER and chat.composer.queued == "Summarise it"
    assert ops.send(chat) == ops.Changed.NOTHING  # a second Send while the first waits: nothing more
    wait_for(chat, chat.composer.queued_changed, lambda q: q is None)
    assert "started" not in log.names() and not chat.generation.busy
    assert [(m.id, m.content) for m in chat.session.store.messages(conv)] == before  # nothing saved
    assert chat.composer.text == "Summarise it" and [d.name for d in chat.composer.attachments.documents] == ["huge.txt"]
    budget = chat.composer.budget
    assert budget is not None and budget.documents_refused and chat.composer.counted("Summarise it")
    assert chat.composer.refusal().startswith("Too long: the documents")
    assert "400-token context" in chat.composer.refusal()
    assert "raise this conversation's context limit in Settings (the model holds 4,096 tokens)" in chat.composer.refusal()
    room = budget.room_for_documents
    assert 0 < room < budget.documents
    assert budget.document_note(budget.documents, None, False) == f"too long: {room:,} tokens of documents fit"
    # Sent again once counted: refused at once, still nothing saved.
    assert ops.send(chat) == ops.Changed.NOTHING and chat.composer.queued is None
    assert [(m.id, m.content) for m in chat.session.store.messages(conv)] == before


def test_a_send_with_a_file_still_being_read_goes_with_it_once_read_when_it_fits(chat: Chat, tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text(SENTENCE * 3)
    chat.composer.type("What does it say?")
    chat.composer.attach([str(note)])
    assert chat.composer.must_count("What does it say?")  # the file goes with it: counted first
    assert ops.send(chat) == ops.Changed.COMPOSER and chat.composer.queued is not None
    (pending,) = wait_for(chat, chat.generation.started)
    wait_for(chat, chat.generation.finished)
    user = chat.conversation.vms[0]
    assert user.content == "What does it say?" and [d.name for d in user.documents] == ["note.txt"]
    assert [d.name for d in chat.session.store.documents([user.id])[user.id]] == ["note.txt"]
    assert chat.composer.text == "" and chat.composer.attachments.documents == ()


def test_an_unanswerable_message_loses_a_document_then_is_answered(chat: Chat, tmp_path: Path) -> None:
    from engine.documents.bounded import read_file

    huge = tmp_path / "huge.txt"
    huge.write_text(SENTENCE * 300)
    conv = chat.session.new_conversation(ChatSettings(sampler=settings().sampler, context_length=400))
    message = chat.session.store.add_message(conv, None, "user", "Summarise it", documents=[read_file(str(huge))])
    ops.open_conversation(chat, conv)
    (user,) = chat.conversation.vms
    assert user.id == message.id and user.unanswered
    told: list[str] = []
    chat.notices.notice_changed.connect(told.append)
    ops.regenerate(chat)  # answering it is refused again: how to repair it is told
    title, text = wait_for(chat, chat.notices.error_raised)
    assert "documents" in text and told and told[-1].startswith("This message cannot be answered")
    assert [vm.id for vm in chat.conversation.vms] == [user.id]
    assert ops.remove_document(chat, user.id, 1) == ops.Changed.NOTHING  # no second document: said, nothing changed
    assert ops.remove_document(chat, user.id, 0) == ops.Changed.STORE | ops.Changed.CONVERSATION
    assert chat.session.store.documents([user.id]) == {} and chat.conversation.vms[0].documents == ()
    assert told[-1].startswith("huge.txt is no longer part of this message")
    ops.regenerate(chat)
    wait_for(chat, chat.generation.finished)
    assert [vm.role for vm in chat.conversation.vms] == ["user", "assistant"] and not chat.conversation.vms[0].unanswered
    errors: list[tuple[str, str]] = []
    chat.notices.error_raised.connect(lambda *a: errors.append(a))
    assert ops.remove_document(chat, user.id, 0) == ops.Changed.NOTHING  # answered: its files made the reply
    assert errors and "has replies" in errors[-1][1]


def test_the_count_told_is_never_another_conversations_nor_an_old_branchs(chat: Chat) -> None:
    def path() -> tuple[Optional[int], tuple[int, ...]]:
        return chat.conversation.conv_id, tuple(vm.id for vm in chat.conversation.vms)

    def counted_here() -> Any:
        return wait_for(chat, chat.composer.budget_changed, lambda b: b is not None and chat.composer.budget_path == path())[0]

    ops.send(chat, "Why is the sky blue? Say it in a few words, please.")
    wait_for(chat, chat.generation.finished)
    first = chat.conversation.conv_id
    counted_here()
    told: list[Any] = []
    chat.composer.budget_changed.connect(told.append)
    ops.open_conversation(chat, None)  # another conversation (a new one): the count goes at once
    assert told == [None] and chat.composer.budget is None and not chat.composer.counting
    ops.open_conversation(chat, first)
    assert chat.composer.budget is None and chat.composer.counting  # nothing told until this path's own count
    counted_here()
    # An edit: the old branch's count is not told as this one's while the edit's reply runs.
    (user,) = [vm for vm in chat.conversation.vms if vm.role == "user"]
    told.clear()
    ops.edit(chat, user.id, "Hi.")
    assert chat.generation.busy and told == [None] and chat.composer.counting
    wait_for(chat, chat.generation.finished)
    assert counted_here() is chat.composer.budget and chat.composer.budget_path == path()
