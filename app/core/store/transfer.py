"""Export and import of a whole conversation tree (Verbatim JSON, Markdown), and the tree checks
an import and `verbatim check` rely on."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Union

from app.core.store.records import (
    _EXPORTED_FIELDS,
    ASSISTANT_FIELDS,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    STATUSES,
    Conversation,
    StoreError,
    _encode_fields,
)
from app.core.store.documents import exported, imported
from engine.types import ROLES


class Transfer:
    """Export / import, mixed into ConversationStore (uses its transaction and row helpers)."""

    def export_json(self, conv_id: int) -> str:
        """The whole tree (every variant, all metadata) as JSON; `import_json` restores it exactly.
        Message ids in the file are local (1..n, oldest first), not database ids."""
        with self._tx(write=False):
            conv = self._get_conversation(conv_id)
            msgs = self.messages(conv_id)
            docs = self._documents_of([m.id for m in msgs])
        local = {m.id: i + 1 for i, m in enumerate(msgs)}
        doc = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "conversation": {
                "title": conv.title, "created_at": conv.created_at, "updated_at": conv.updated_at,
                "settings": conv.settings, "active_root": local.get(conv.active_root_id),
            },  # fmt: skip
            "messages": [
                {
                    **{k: getattr(m, k) for k in _EXPORTED_FIELDS},
                    "id": local[m.id],
                    "parent": local.get(m.parent_id),
                    "active_child": local.get(m.active_child_id),
                    **({"documents": exported(docs[m.id])} if m.id in docs else {}),
                }
                for m in msgs
            ],
        }
        return json.dumps(doc, indent=1, ensure_ascii=False)

    def import_json(self, text: Union[str, bytes]) -> Conversation:
        """Import an `export_json` document as a new conversation, all or nothing."""
        try:
            doc = json.loads(text)
        except (ValueError, TypeError) as e:
            raise StoreError(f"Not a Verbatim conversation file: invalid JSON ({e})") from e
        conv, msgs = _validate_export(doc)
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO conversations (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
                (conv["title"], conv["created_at"], conv["updated_at"], json.dumps(conv["settings"], sort_keys=True)),
            )
            new_conv = cur.lastrowid
            ids: dict[int, int] = {}
            for m in msgs:
                fields = {k: m.get(k) for k in ASSISTANT_FIELDS}
                cols = {
                    "conversation_id": new_conv, "parent_id": ids.get(m["parent"]), "role": m["role"],
                    "content": m["content"], "created_at": m["created_at"],
                    # A reply exported mid-generation is not being generated here.
                    "status": "interrupted" if m["status"] == "generating" else m["status"],
                    **_encode_fields(fields),
                }  # fmt: skip
                names = ", ".join(cols)
                marks = ", ".join(f":{k}" for k in cols)
                ids[m["id"]] = c.execute(f"INSERT INTO messages ({names}) VALUES ({marks})", cols).lastrowid
                self._add_documents(ids[m["id"]], m["documents"])
            for m in msgs:
                if m["active_child"] is not None:
                    c.execute(
                        "UPDATE messages SET active_child_id = ? WHERE id = ?", (ids[m["active_child"]], ids[m["id"]])
                    )
            c.execute(
                "UPDATE conversations SET active_root_id = ? WHERE id = ?", (ids.get(conv["active_root"]), new_conv)
            )
            return self._get_conversation(new_conv)

    def export_markdown(self, conv_id: int) -> str:
        """The active path as readable Markdown (variants noted as "reply 2 / 3")."""
        with self._tx(write=False):
            conv = self._get_conversation(conv_id)
            path = self.active_path(conv_id)
            positions = {m.id: self.position(m.id) for m in path}
            docs = self._documents_of([m.id for m in path])
        lines = [f"# {conv.title}", "", f"*Exported from Verbatim. Created {_when(conv.created_at)}.*", ""]
        system = conv.settings.get("system_prompt")
        if system:
            lines += ["## System", "", system, ""]
        for m in path:
            head = m.role.capitalize()
            notes = []
            pos = positions[m.id]
            if pos.count > 1:
                notes.append(f"variant {pos}")
            if m.model_name or m.model_key:
                notes.append(f"model {m.model_name or m.model_key}")
            if m.seed is not None:
                notes.append(f"seed {m.seed}")
            if m.status != "complete":
                notes.append(m.status)
            lines += [f"## {head}" + (f" ({', '.join(notes)})" if notes else ""), ""]
            for d in docs.get(m.id, []):  # the file's name and digest; its text is in the JSON export
                pages = f", {d.pages} pages" if d.pages else ""
                lines += [f"*Attached: {d.name}{pages} (sha256 {d.digest[:12]}…)*", ""]
            lines += [m.content, ""]
        return "\n".join(lines).rstrip() + "\n"

    def integrity_check(self) -> str:
        """SQLite's full integrity check: "ok" or the first problem."""
        with self._tx(write=False) as c:
            return c.execute("PRAGMA integrity_check").fetchone()[0]

    def tree_problems(self, conv_id: Optional[int] = None) -> list[str]:
        """Structural problems (should always be empty): orphans, cross-conversation parents,
        active pointers that are not a child, foreign-key violations."""
        where, args = ("WHERE m.conversation_id = ?", (conv_id,)) if conv_id is not None else ("", ())
        problems: list[str] = []
        with self._tx(write=False) as c:
            for r in c.execute(
                f"""SELECT m.id, m.parent_id, p.id AS pid, p.conversation_id AS pconv, m.conversation_id AS conv
                    FROM messages m LEFT JOIN messages p ON p.id = m.parent_id {where}""",
                args,
            ):
                if r["parent_id"] is not None and r["pid"] is None:
                    problems.append(f"message {r['id']}: parent {r['parent_id']} missing")
                elif r["pid"] is not None and r["pconv"] != r["conv"]:
                    problems.append(f"message {r['id']}: parent in another conversation")
            for r in c.execute(
                f"""SELECT m.id, m.active_child_id FROM messages m LEFT JOIN messages ch
                    ON ch.id = m.active_child_id {where}
                    {'AND' if where else 'WHERE'} m.active_child_id IS NOT NULL
                    AND (ch.id IS NULL OR ch.parent_id IS NOT m.id)""",
                args,
            ):
                problems.append(f"message {r['id']}: active child {r['active_child_id']} is not its child")
            cwhere = "AND conv.id = ?" if conv_id is not None else ""
            for r in c.execute(
                f"""SELECT conv.id, conv.active_root_id FROM conversations conv
                    LEFT JOIN messages m ON m.id = conv.active_root_id
                    WHERE conv.active_root_id IS NOT NULL {cwhere}
                    AND (m.id IS NULL OR m.parent_id IS NOT NULL OR m.conversation_id != conv.id)""",
                args,
            ):
                problems.append(f"conversation {r['id']}: active root {r['active_root_id']} is not a first message")
            for r in c.execute(
                f"""SELECT conv.id FROM conversations conv WHERE conv.active_root_id IS NULL {cwhere}
                    AND EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = conv.id)""",
                args,
            ):
                problems.append(f"conversation {r['id']}: has messages but no active root")
            for r in c.execute("PRAGMA foreign_key_check"):
                problems.append(f"foreign key violation in {r[0]} row {r[1]}")
        return problems

    # ---- export / import


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _validate_export(doc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Check an export document completely before anything is written; StoreError says what is wrong."""
    try:
        return _check_export(doc)
    except (TypeError, AttributeError, KeyError) as e:  # e.g. an id that is a list
        raise StoreError(f"Not a valid Verbatim conversation file: {e}") from e


def _check_export(doc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:

    def bad(why: str) -> StoreError:
        return StoreError(f"Not a valid Verbatim conversation file: {why}")

    def check(cond: bool, why: str) -> None:
        if not cond:
            raise bad(why)

    num = (int, float)
    check(isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT, "missing format marker")
    check(doc.get("version") == EXPORT_VERSION, f"unsupported version {doc.get('version')!r}")
    conv, msgs = doc.get("conversation"), doc.get("messages")
    check(isinstance(conv, dict), "'conversation' must be an object")
    check(isinstance(msgs, list), "'messages' must be a list")
    check(isinstance(conv.get("title"), str), "conversation title must be a string")
    check(isinstance(conv.get("settings"), dict), "conversation settings must be an object")
    for k in ("created_at", "updated_at"):
        check(isinstance(conv.get(k), num) and not isinstance(conv.get(k), bool), f"conversation {k} must be a number")
    optional: dict[str, Callable[[Any], bool]] = {
        "seed": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "sampler": lambda v: isinstance(v, dict),
        "model_key": lambda v: isinstance(v, str),
        "model_name": lambda v: isinstance(v, str),
        "tokens": lambda v: isinstance(v, list) and all(type(t) is int and -(2**31) <= t < 2**31 for t in v),
        "logprobs": lambda v: isinstance(v, list) and all(type(x) in (int, float) for x in v),
        "finish_reason": lambda v: isinstance(v, str),
        "cache_report": lambda v: isinstance(v, dict),
        "timings": lambda v: isinstance(v, dict),
    }
    seen: dict[int, dict[str, Any]] = {}
    for n, m in enumerate(msgs):
        where = f"message #{n + 1}"
        check(isinstance(m, dict), f"{where} must be an object")
        mid = m.get("id")
        check(type(mid) is int and mid not in seen, f"{where} has a missing or duplicate id")
        check(m.get("parent") is None or m.get("parent") in seen, f"{where} refers to an unknown or later parent")
        check(m.get("role") in ROLES, f"{where} has an unknown role")
        check(isinstance(m.get("content"), str), f"{where} content must be a string")
        check(m.get("status", "complete") in STATUSES, f"{where} has an unknown status")
        check(type(m.get("created_at")) in (int, float), f"{where} created_at must be a number")
        for k, ok in optional.items():
            check(m.get(k) is None or ok(m[k]), f"{where} has an invalid {k}")
        documents = imported(m.get("documents"), where)
        check(not documents or m["role"] == "user", f"{where}: only a user message can carry documents")
        m = {**m, "status": m.get("status", "complete"), "active_child": m.get("active_child"),
             "documents": documents}
        seen[mid] = m
    for m in seen.values():
        ch = m["active_child"]
        ok = ch is None or (ch in seen and seen[ch]["parent"] == m["id"])
        check(ok, f"message id {m['id']} has an invalid active child")
    root = conv.get("active_root")
    check(
        root is None and not seen or (root in seen and seen[root]["parent"] is None),
        "the active first message is missing or not a first message",
    )
    return conv, list(seen.values())
