"""Conversation store: the tree, export/import, schema versions, refusal of bad files, and crashes.

Real SQLite files in tmp_path and real child processes killed with SIGKILL; no mocks.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from array import array
from pathlib import Path

import pytest

from app.core.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    ConversationStore,
    StoreError,
    assistant_fields_from_result,
    migrate,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "verbatim.sqlite3"


@pytest.fixture
def store(db: Path):
    s = ConversationStore(db)
    yield s
    s.close()


def chat(store: ConversationStore, turns: int = 2, system: str = "Be brief."):
    """A conversation of `turns` user/assistant pairs; returns (conv, messages on the path)."""
    conv = store.create_conversation("Sky colour", {"system_prompt": system, "mode": "exact"})
    parent, path = None, []
    for i in range(turns):
        u = store.add_message(conv.id, parent, "user", f"question {i}")
        a = store.add_message(
            conv.id, u.id, "assistant", f"answer {i}", seed=i, sampler={"temperature": 0.7},
            model_key="k1", model_name="SmolLM2", tokens=[5, 6, 7], logprobs=[-0.5, -1e-9, -3.25],
            finish_reason="stop", cache_report={"restored": 10, "source": "memory"}, timings={"ttft_s": 0.01},
        )  # fmt: skip
        path += [u, a]
        parent = a.id
    return conv, path


# --------------------------------------------------------------------------- tree


def test_defaults_to_wal_and_user_data_dir(store: ConversationStore, db: Path) -> None:
    assert db.exists()
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    from app.core.store import default_path

    assert default_path().name == "verbatim.sqlite3" and "Verbatim" in str(default_path())


def test_conversation_crud_and_listing(store: ConversationStore) -> None:
    a = store.create_conversation("first")
    b = store.create_conversation("second", {"sampler": {"temperature": 0.5}})
    assert [c.title for c in store.list_conversations()] == ["second", "first"]
    store.rename_conversation(a.id, "renamed")  # touching moves it to the top
    assert [c.title for c in store.list_conversations()] == ["renamed", "second"]
    assert store.set_settings(b.id, {"mode": "fast"}).settings == {"mode": "fast"}
    store.delete_conversation(a.id)
    assert [c.id for c in store.list_conversations()] == [b.id]
    with pytest.raises(StoreError):
        store.get_conversation(a.id)


def test_assistant_metadata_round_trips_exactly(store: ConversationStore) -> None:
    conv, path = chat(store, 1)
    lp = [-0.1, -1 / 3, float("-inf"), -7.000000000000001]
    store.update_message(path[1].id, tokens=[0, 2**31 - 1, 49151], logprobs=lp)
    m = store.get_message(path[1].id)
    assert m.tokens == [0, 2**31 - 1, 49151] and m.logprobs == lp  # bit-exact floats
    assert (m.seed, m.model_key, m.model_name, m.finish_reason) == (0, "k1", "SmolLM2", "stop")
    assert m.sampler == {"temperature": 0.7} and m.cache_report["source"] == "memory"


def test_reply_lifecycle_and_prompt(store: ConversationStore) -> None:
    conv, path = chat(store, 1)
    u = store.add_message(conv.id, path[-1].id, "user", "and at night?")  # committed first
    reply = store.add_message(conv.id, u.id, "assistant", "", status="generating", seed=42)
    prompt = store.messages_for_prompt(conv.id, u.id)
    assert prompt == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "question 0"},
        {"role": "assistant", "content": "answer 0"},
        {"role": "user", "content": "and at night?"},
    ]
    store.update_message(reply.id, content="Dark")
    done = store.update_message(reply.id, content="Dark blue.", status="complete", finish_reason="stop")
    assert (done.content, done.status, done.seed) == ("Dark blue.", "complete", 42)
    assert store.active_path(conv.id)[-1].id == reply.id
    with pytest.raises(TypeError):
        store.update_message(reply.id, colour="blue")
    with pytest.raises(StoreError):
        store.add_message(conv.id, u.id, "robot", "x")
    no_system = store.create_conversation("plain")
    m = store.add_message(no_system.id, None, "user", "hi")
    assert store.messages_for_prompt(no_system.id, m.id) == [{"role": "user", "content": "hi"}]


def test_fields_from_engine_result(store: ConversationStore) -> None:
    from engine.types import CacheReport, GenerationResult

    report = CacheReport(
        prompt_tokens=9, restored=8, source="disk", seed=7, sampler={"temperature": 0.0}, model_key="mk"
    )
    result = GenerationResult("Paris.", [1, 2], [-0.25, -0.5], "stop", 7, [3] * 9, report)
    conv = store.create_conversation()
    u = store.add_message(conv.id, None, "user", "Capital of France?")
    r = store.add_message(conv.id, u.id, "assistant", result.text, **assistant_fields_from_result(result))
    assert r.cache_report == report.to_dict() and r.tokens == [1, 2] and r.model_key == "mk"
    assert r.timings == {"ttft_s": 0.0, "prefill_tps": 0.0, "decode_tps": 0.0}


def test_variants_position_and_switch(store: ConversationStore) -> None:
    conv, path = chat(store, 1)
    u, a1 = path
    a2 = store.add_message(conv.id, u.id, "assistant", "answer 0 again", seed=1)
    a3 = store.add_message(conv.id, u.id, "assistant", "answer 0 third", seed=2)
    assert [m.id for m in store.siblings(a2.id)] == [a1.id, a2.id, a3.id]
    assert [str(store.position(m.id)) for m in (a1, a2, a3)] == ["1 / 3", "2 / 3", "3 / 3"]
    assert store.active_path(conv.id)[-1].id == a3.id  # the newest variant is shown
    store.set_active(a2.id)
    assert [m.id for m in store.active_path(conv.id)] == [u.id, a2.id]
    assert str(store.position(u.id)) == "1 / 1"


def test_branch_on_edit_keeps_the_original(store: ConversationStore) -> None:
    conv, path = chat(store, 2)
    u0, a0, u1, a1 = path
    edited = store.edit_message(u1.id, "question 1, rephrased")
    assert edited.parent_id == a0.id and edited.role == "user"
    assert [m.id for m in store.active_path(conv.id)] == [u0.id, a0.id, edited.id]
    b = store.add_message(conv.id, edited.id, "assistant", "answer to rephrased")
    assert str(store.position(edited.id)) == "2 / 2"
    assert store.messages_for_prompt(conv.id, edited.id)[-1]["content"] == "question 1, rephrased"
    # Back to the original branch: its reply is still the active child there.
    store.set_active(u1.id)
    assert [m.id for m in store.active_path(conv.id)] == [u0.id, a0.id, u1.id, a1.id]
    # Selecting a deep message activates its whole ancestry.
    store.set_active(b.id)
    assert [m.id for m in store.active_path(conv.id)] == [u0.id, a0.id, edited.id, b.id]
    # Editing the very first message branches at the root.
    root2 = store.edit_message(u0.id, "different start")
    assert store.active_path(conv.id) == [store.get_message(root2.id)]
    assert str(store.position(root2.id)) == "2 / 2"
    assert store.tree_problems() == []


def test_delete_subtree(store: ConversationStore) -> None:
    conv, path = chat(store, 3)
    u0, a0, u1, a1, u2, a2 = path
    alt = store.add_message(conv.id, u1.id, "assistant", "alt answer 1")  # active now
    store.add_message(conv.id, alt.id, "user", "under alt")
    store.delete_message(alt.id)
    assert [m.id for m in store.active_path(conv.id)] == [m.id for m in path]  # falls back to a1
    store.delete_message(u1.id)  # everything from turn 1 on
    assert [m.id for m in store.messages(conv.id)] == [u0.id, a0.id]
    assert store.active_path(conv.id)[-1].id == a0.id
    assert store.get_message(a0.id).active_child_id is None
    store.delete_message(u0.id)
    assert store.messages(conv.id) == [] and store.get_conversation(conv.id).active_root_id is None
    assert store.tree_problems() == [] and store.integrity_check() == "ok"


def test_deleting_a_long_chain_is_fast(store: ConversationStore) -> None:
    conv = store.create_conversation()
    parent = None
    with store._tx():  # one transaction: building 2000 rows one fsync each would be slow
        for i in range(2000):
            role = "user" if i % 2 == 0 else "assistant"
            parent = store._insert_message(conv.id, parent, role, f"m{i}", "complete", {}).id
    assert len(store.active_path(conv.id)) == 2000
    # Fast = a fixed number of statements whatever the chain's length (no wall-clock limit: the
    # same statements on a short chain, counted through SQLite's trace hook).
    short = store.create_conversation()
    first = store._insert_message(short.id, None, "user", "a", "complete", {})
    store._insert_message(short.id, first.id, "assistant", "b", "complete", {})
    counts = []
    for cid in (short.id, conv.id):
        statements: list[str] = []
        store._conn.set_trace_callback(lambda sql: sql.startswith("--") or statements.append(sql))
        try:
            store.delete_message(store.active_path(cid)[0].id)
        finally:
            store._conn.set_trace_callback(None)
        # A statement's foreign-key actions are traced as repeats of it, one per row: count runs.
        counts.append(sum(1 for i, sql in enumerate(statements) if i == 0 or statements[i - 1] != sql))
    assert counts[0] == counts[1], counts
    assert store.messages(conv.id) == []


def test_search_titles_and_all_variants(store: ConversationStore) -> None:
    conv, path = chat(store, 1)
    store.add_message(conv.id, path[0].id, "assistant", "Rayleigh SCATTERING explains it")
    other = store.create_conversation("Über Rayleigh")
    hits = store.search("rayleigh")
    assert [h.conversation.id for h in hits] == [other.id, conv.id]
    assert hits[0].message_id is None and hits[1].message_id is not None
    assert "SCATTERING" in hits[1].snippet
    assert [h.conversation.id for h in store.search("über")] == [other.id]  # non-ASCII case folding
    assert store.search("no such words") == [] and store.search("") == []
    assert [h.conversation.id for h in store.search("100%")] == []  # no LIKE wildcards


def test_search_snippet_shows_the_matched_word_and_the_index_follows_edits(store: ConversationStore) -> None:
    conv, path = chat(store, 1)
    long = ("The longest rivers in Europe are: " + "the Volga, which flows into the Caspian Sea; " * 8
            + "the Danube, which flows through ten countries; " + "and many more. " * 20)  # fmt: skip
    reply = store.add_message(conv.id, path[0].id, "assistant", long)
    hit = store.search("Danube")[0]
    assert hit.message_id == reply.id and "Danube" in hit.snippet and len(hit.snippet) < 200
    assert [h.message_id for h in store.search("danu")] == [reply.id]  # a word's start
    assert [h.message_id for h in store.search("danube ten")] == [reply.id]  # every word, any order
    assert store.search("danube eleven") == []
    assert store.search('danube" OR "zzz') == [] and store.search("NEAR(") == []  # input is never FTS syntax
    store.update_message(reply.id, content="Nothing about rivers now")
    assert store.search("Danube") == [] and [h.message_id for h in store.search("rivers")] == [reply.id]
    store.delete_message(reply.id)
    assert store.search("rivers") == []


# --------------------------------------------------------------------------- export / import


def test_json_round_trip_is_exact(store: ConversationStore) -> None:
    conv, path = chat(store, 2)
    store.add_message(conv.id, path[0].id, "assistant", "variant", seed=9, logprobs=[float("-inf")])
    store.edit_message(path[2].id, "edited")
    store.set_active(path[3].id)
    exported = store.export_json(conv.id)
    doc = json.loads(exported)
    assert doc["format"] == "verbatim.conversation" and len(doc["messages"]) == 6
    copy = store.import_json(exported)
    assert copy.id != conv.id and copy.title == conv.title and copy.created_at == conv.created_at
    assert store.export_json(copy.id) == exported
    assert [m.content for m in store.active_path(copy.id)] == [m.content for m in store.active_path(conv.id)]
    # And into a fresh database.
    other = ConversationStore(store.path.with_name("other.sqlite3"))
    assert other.export_json(other.import_json(exported.encode()).id) == exported
    other.close()


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"format": "something else", "version": 1}',
        '{"format": "verbatim.conversation", "version": 99, "conversation": {}, "messages": []}',
    ],
)
def test_import_rejects_malformed_files(store: ConversationStore, text: str) -> None:
    with pytest.raises(StoreError, match="Verbatim conversation file"):
        store.import_json(text)
    assert store.list_conversations() == []


def test_import_is_all_or_nothing(store: ConversationStore) -> None:
    conv, _ = chat(store, 3)
    doc = json.loads(store.export_json(conv.id))
    before = store.export_json(conv.id)
    broken = [
        lambda d: d["messages"][-1].update(role="wizard"),
        lambda d: d["messages"][-1].update(parent=999),
        lambda d: d["messages"][2].update(parent=d["messages"][4]["id"]),  # later parent: a cycle
        lambda d: d["messages"][-1].update(tokens=[1, "two"]),
        lambda d: d["messages"][0].update(active_child=d["messages"][3]["id"]),  # not its child
        lambda d: d["messages"][-1].update(id=[1]),
        lambda d: d["conversation"].update(active_root=None),
        lambda d: d["messages"].append({"id": 100, "parent": None}),
    ]
    for breaker in broken:
        d = json.loads(json.dumps(doc))
        breaker(d)
        with pytest.raises(StoreError):
            store.import_json(json.dumps(d))
        assert [c.id for c in store.list_conversations()] == [conv.id]
    assert store.export_json(conv.id) == before
    # A database-level failure mid-import also leaves nothing behind (the transaction rolls back).
    d = json.loads(json.dumps(doc))
    d["messages"][-1]["seed"] = 2**70  # passes validation, too large for SQLite's INTEGER
    with pytest.raises((StoreError, OverflowError)):
        store.import_json(json.dumps(d))
    assert [c.id for c in store.list_conversations()] == [conv.id]
    assert store._conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 6


def test_markdown_export(store: ConversationStore) -> None:
    conv, path = chat(store, 2)
    store.add_message(conv.id, path[2].id, "assistant", "a better answer 1", seed=5, model_name="SmolLM2")
    md = store.export_markdown(conv.id)
    assert md.startswith("# Sky colour\n")
    assert "## System\n\nBe brief." in md
    assert "## User\n\nquestion 0" in md and "## User\n\nquestion 1" in md
    assert "## Assistant (variant 2 / 2, model SmolLM2, seed 5)\n\na better answer 1" in md
    assert "answer 1\n" not in md.replace("a better answer 1", "")  # only the active path
    assert md.index("question 0") < md.index("answer 0") < md.index("question 1")


# --------------------------------------------------------------------------- versions and bad files


def test_migration_from_v1_keeps_data_and_backs_up(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:1]) == 1
    conn.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES (1, 'old', 1.0, 1.0)")
    conn.execute(
        "INSERT INTO messages (id, conversation_id, role, content, created_at) VALUES (1, 1, 'user', 'hi', 1.0)"
    )
    conn.execute("UPDATE conversations SET active_root_id = 1")
    conn.close()
    with ConversationStore(db) as s:
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        names = {r[0] for r in s._conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "messages_parent" in names
        assert [m.content for m in s.active_path(1)] == ["hi"]
        assert [h.message_id for h in s.search("hi")] == [1]  # v3's search index covers old rows
    backup = db.with_name(db.name + ".v1.bak")
    assert sqlite3.connect(backup).execute("PRAGMA user_version").fetchone()[0] == 1


def test_migration_to_v4_gives_each_reply_its_one_run(db: Path) -> None:
    """Replies stored before runs were kept get one run each, from the report stored with them."""
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:3]) == 3
    report = {"prompt_tokens": 41, "restored": 40, "source": "memory", "ttft_s": 0.3, "mode": "exact",
              "action": "regenerate", "previous_id": 2, "identical": True, "first_diff": None, "max_logprob_diff": 0.0}
    conn.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES (1, 'old', 1.0, 1.0)")
    conn.execute("INSERT INTO messages (id, conversation_id, role, content, created_at) VALUES (1, 1, 'user', 'hi', 1.0)")
    conn.execute(
        "INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, seed, tokens, finish_reason,"
        " cache_report) VALUES (2, 1, 1, 'assistant', 'yo', 2.0, 7, ?, 'stop', ?)",
        (array("i", [5, 6, 7]).tobytes(), json.dumps(report)),
    )
    conn.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, status)"
                 " VALUES (3, 1, 1, 'assistant', 'cut', 3.0, 'interrupted')")  # no report: no run
    conn.close()
    with ConversationStore(db) as s:
        runs = s.runs(1)
        assert list(runs) == [2] and len(runs[2]) == 1
        run = runs[2][0]
        assert (run.message_id, run.seed, run.finish_reason, run.n_tokens, run.created_at) == (2, 7, "stop", 3, 2.0)
        assert (run.report.restored, run.report.source, run.mode) == (40, "memory", "exact")
        assert run.action == "regenerate" and run.outcome.comparison.identical is True


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "m.sqlite3", isolation_level=None)
    migrate(conn, MIGRATIONS)
    bad = [*MIGRATIONS, ("ALTER TABLE messages ADD COLUMN pinned INTEGER", "THIS IS NOT SQL")]
    with pytest.raises(sqlite3.Error):
        migrate(conn, bad)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    columns = [r[1] for r in conn.execute("PRAGMA table_info(messages)")]
    assert "pinned" not in columns  # the half-done step left no trace


def test_newer_schema_is_refused_untouched(db: Path) -> None:
    with ConversationStore(db) as s:
        chat(s, 1)
        s._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = db.read_bytes()
    with pytest.raises(StoreError, match="newer Verbatim"):
        ConversationStore(db)
    with pytest.raises(StoreError, match="newer Verbatim"):
        ConversationStore(db, read_only=True)
    assert db.read_bytes() == before


def test_garbage_file_is_refused_untouched(db: Path) -> None:
    db.parent.mkdir(parents=True)
    garbage = os.urandom(8192)
    db.write_bytes(garbage)
    with pytest.raises(StoreError, match="damaged or not a database.*left untouched"):
        ConversationStore(db)
    assert db.read_bytes() == garbage


def test_damaged_pages_are_refused_untouched(db: Path) -> None:
    with ConversationStore(db) as s:
        for _ in range(3):
            chat(s, 5)
        s._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) >= 4 * page
    data[2 * page + 100 : 3 * page] = b"\xff" * (page - 100)  # wreck a b-tree page, keep the header
    db.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged"):
        ConversationStore(db)
    assert db.read_bytes() == bytes(data)


def test_foreign_sqlite_file_is_refused(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE notes (x)")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(StoreError, match="does not belong to Verbatim"):
        ConversationStore(db)
    assert db.read_bytes() == before


def test_read_only_store_reads_but_rejects_writes(db: Path) -> None:
    writer = ConversationStore(db)
    conv, path = chat(writer, 1)
    generating = writer.add_message(conv.id, path[0].id, "assistant", "", status="generating")
    reader = ConversationStore(db, read_only=True)
    assert [m.id for m in reader.active_path(conv.id)] == [path[0].id, generating.id]
    # The live writer's reply is not marked interrupted by a read-only open.
    assert reader.get_message(generating.id).status == "generating"
    for write in (
        lambda: reader.create_conversation("x"),
        lambda: reader.add_message(conv.id, None, "user", "x"),
        lambda: reader.update_message(generating.id, content="x"),
        lambda: reader.set_active(path[1].id),
        lambda: reader.delete_message(path[0].id),
        lambda: reader.delete_conversation(conv.id),
        lambda: reader.import_json(writer.export_json(conv.id)),
    ):
        with pytest.raises(StoreError, match="read-only"):
            write()
    # SQLite itself refuses too (query_only), should a write ever bypass the API.
    with pytest.raises(sqlite3.Error):
        reader._conn.execute("DELETE FROM messages")
    writer.update_message(generating.id, content="done", status="complete")
    assert reader.get_message(generating.id).content == "done"  # sees new commits
    reader.close()
    writer.close()
    with ConversationStore(db, read_only=True) as r:  # with no writer around (no -wal/-shm) too
        assert len(r.messages(conv.id)) == 3
    with pytest.raises(StoreError, match="No conversation database"):
        ConversationStore(db.with_name("missing.sqlite3"), read_only=True)


def test_leftover_generating_rows_become_interrupted(db: Path) -> None:
    with ConversationStore(db) as s:
        conv, path = chat(s, 1)
        r = s.add_message(conv.id, path[0].id, "assistant", "partial", status="generating")
    with ConversationStore(db) as s:
        m = s.get_message(r.id)
        assert (m.status, m.content) == ("interrupted", "partial")
        assert s.active_path(conv.id)[-1].id == r.id
        assert "(variant 2 / 2, interrupted)" in s.export_markdown(conv.id)


# --------------------------------------------------------------------------- SIGKILL


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[3])
    from app.core.store import ConversationStore
    db, mode = sys.argv[1], sys.argv[2]

    def say(*a):
        print(*a, flush=True)

    s = ConversationStore(db)
    conv = s.create_conversation("crash test")
    say("C", conv.id)
    parent = None

    def turn(i):
        global parent
        u = s.add_message(conv.id, parent, "user", f"u{i}")
        say("M", u.id, f"u{i}")
        r = s.add_message(conv.id, u.id, "assistant", "", status="generating", seed=i)
        say("M", r.id, "")
        for k in range(3):
            s.update_message(r.id, content=f"partial {k}")
            say("M", r.id, f"partial {k}")
        if i % 3 == 1:  # a regeneration: a sibling variant, then back to the first
            v = s.add_message(conv.id, u.id, "assistant", f"variant {i}", seed=100 + i)
            say("M", v.id, f"variant {i}")
            s.set_active(r.id)
        s.update_message(r.id, content=f"reply {i}", status="complete", tokens=[i, i + 1], logprobs=[-0.5, -0.25])
        say("M", r.id, f"reply {i}")
        parent = r.id

    if mode == "loop":
        i = 0
        while True:
            turn(i)
            i += 1
    for i in range(3):
        turn(i)
    if mode == "in_tx_insert":  # paused inside a transaction that inserted a message
        with s._tx():
            m = s._insert_message(conv.id, parent, "user", "never committed", "complete", {})
            say("T", m.id)
            time.sleep(60)
    elif mode == "in_tx_update":  # paused inside a transaction updating a generating reply
        u = s.add_message(conv.id, parent, "user", "last question")
        say("M", u.id, "last question")
        r = s.add_message(conv.id, u.id, "assistant", "saved part", status="generating")
        say("M", r.id, "saved part")
        with s._tx():
            s._conn.execute("UPDATE messages SET content = 'unsaved' WHERE id = ?", (r.id,))
            say("T", r.id)
            time.sleep(60)
    elif mode == "generating":  # killed between two streamed saves
        u = s.add_message(conv.id, parent, "user", "last question")
        say("M", u.id, "last question")
        r = s.add_message(conv.id, u.id, "assistant", "", status="generating")
        s.update_message(r.id, content="half a repl")
        say("M", r.id, "half a repl")
        say("T", r.id)
        time.sleep(60)
    """
)

# The order each reply's content goes through; a later value may be on disk without being reported.
def _progress(content: str) -> tuple[int, int]:
    kind, _, rest = content.partition(" ")
    if content == "":
        return (0, 0)
    if kind == "partial":
        return (1, int(rest))
    if kind == "reply":
        return (2, 0)
    return (-1, 0)


def _run_child(tmp_path: Path, db: Path, mode: str, stop_after: int | None = None, stop_at_marker: bool = False):
    """Start the writer child, SIGKILL it at the chosen point, return what it reported as committed."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), mode, str(ROOT)], stdout=subprocess.PIPE, text=True
    )
    committed: dict[int, str] = {}
    conv_id, pending = None, None
    lines = 0
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            kind, *rest = line.rstrip("\n").split(" ", 2)
            if kind == "C":
                conv_id = int(rest[0])
            elif kind == "M":
                committed[int(rest[0])] = rest[1] if len(rest) > 1 else ""
            elif kind == "T":
                pending = int(rest[0])
                if stop_at_marker:
                    break
            lines += 1
            if stop_after is not None and lines >= stop_after:
                break  # kill right away: the child is already busy with its next write
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    return conv_id, committed, pending


def _assert_consistent(db: Path, conv_id: int, committed: dict[int, str]) -> ConversationStore:
    s = ConversationStore(db)
    assert s.integrity_check() == "ok"
    assert s.tree_problems() == []
    msgs = {m.id: m for m in s.messages(conv_id)}
    for mid, content in committed.items():
        assert mid in msgs, f"committed message {mid} lost"
        got = msgs[mid].content
        if _progress(content)[0] >= 0:
            assert _progress(got) >= _progress(content), (mid, content, got)
        else:
            assert got == content
    assert all(m.status != "generating" for m in msgs.values())
    for m in msgs.values():  # anything not finished is now marked interrupted
        if m.role == "assistant" and not m.content.startswith(("reply", "variant")):
            assert m.status == "interrupted"
    path = s.active_path(conv_id)
    assert all(b.parent_id == a.id for a, b in zip(path, path[1:]))
    return s


@pytest.mark.parametrize("stop_after", [2, 5, 9, 17, 30])
def test_sigkill_while_writing_loses_nothing_committed(tmp_path: Path, db: Path, stop_after: int) -> None:
    conv_id, committed, _ = _run_child(tmp_path, db, "loop", stop_after=stop_after)
    s = _assert_consistent(db, conv_id, committed)
    assert len(s.messages(conv_id)) >= len(committed)
    # The store is fully usable after the crash: the next turn goes on from the active path.
    last = s.active_path(conv_id)[-1]
    u = s.add_message(conv_id, last.id if last.role == "assistant" else last.parent_id, "user", "after crash")
    assert s.active_path(conv_id)[-1].id == u.id
    s.close()


def test_sigkill_inside_an_insert_transaction(tmp_path: Path, db: Path) -> None:
    conv_id, committed, pending = _run_child(tmp_path, db, "in_tx_insert", stop_at_marker=True)
    assert pending is not None and len(committed) == 7  # 3 turns + 1 variant
    s = _assert_consistent(db, conv_id, committed)
    assert pending not in {m.id for m in s.messages(conv_id)}
    assert s.active_path(conv_id)[-1].content == "reply 2"  # the active pointer never moved
    s.close()


def test_sigkill_inside_an_update_transaction(tmp_path: Path, db: Path) -> None:
    conv_id, committed, pending = _run_child(tmp_path, db, "in_tx_update", stop_at_marker=True)
    s = _assert_consistent(db, conv_id, committed)
    m = s.get_message(pending)
    assert (m.content, m.status) == ("saved part", "interrupted")
    s.close()


def test_sigkill_mid_generation_marks_interrupted(tmp_path: Path, db: Path) -> None:
    conv_id, committed, pending = _run_child(tmp_path, db, "generating", stop_at_marker=True)
    s = _assert_consistent(db, conv_id, committed)
    path = s.active_path(conv_id)
    assert path[-1].id == pending and (path[-1].content, path[-1].status) == ("half a repl", "interrupted")
    assert s.messages_for_prompt(conv_id, path[-2].id)[-1] == {"role": "user", "content": "last question"}
    s.close()


IMPORTER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[3])
    from app.core.store import ConversationStore
    s = ConversationStore(sys.argv[1])
    text = open(sys.argv[2]).read()
    print("S", flush=True)
    while True:
        s.import_json(text)
        print("I", flush=True)
    """
)


def test_sigkill_during_import_leaves_whole_conversations_only(tmp_path: Path, db: Path) -> None:
    with ConversationStore(db) as s:
        conv = s.create_conversation("big")
        parent = None
        with s._tx():
            for i in range(1500):
                role, fields = ("assistant", {"tokens": list(range(50))}) if i % 2 else ("user", {})
                parent = s._insert_message(conv.id, parent, role, f"m{i}", "complete", fields).id
        exported = s.export_json(conv.id)
    (tmp_path / "big.json").write_text(exported)
    (tmp_path / "importer.py").write_text(IMPORTER)
    for delay in (0.05, 0.3):
        proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "importer.py"), str(db), str(tmp_path / "big.json"), str(ROOT)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout.readline() == "S\n"  # type: ignore[union-attr]
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        reported = proc.stdout.read().count("I\n")  # type: ignore[union-attr]
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        with ConversationStore(db) as s:
            assert s.integrity_check() == "ok" and s.tree_problems() == []
            convs = s.list_conversations()
            for c in convs:
                assert len(s.messages(c.id)) == 1500 and len(s.active_path(c.id)) == 1500
            assert len(convs) >= 1 + reported
