"""Every error a user can cause, under one base class.

A `VerbatimError` carries a message meant for people: the CLI prints it as one line and exits 2,
the GUI shows it in a dialog. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class VerbatimError(Exception):
    """An error a user can cause (bad input, bad file, missing model): one clear line."""


class EngineError(VerbatimError):
    """The engine cannot do what was asked (no model loaded, a model folder mlx-lm rejects)."""


class ServerUnreachable(EngineError):
    """A Verbatim server (engine/remote.py) cannot be reached, or the connection to it was lost."""


class RequestError(VerbatimError, ValueError):
    """A bad generation request (unknown role, empty conversation, a template that rejects it).
    `param`: the request field at fault, when one is (the server's 400 names it)."""

    def __init__(self, message: str = "", param: "str | None" = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(RequestError):
    """The conversation does not fit the model's context: refused before any prefill."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context_length: int, note: str = "") -> None:
        super().__init__(f"prompt has {prompt_tokens} tokens, max tokens {max_tokens}, "
                         f"the model's context is {context_length}{note}")
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length


class ModelError(VerbatimError):
    """A model that cannot be found or used."""


class GGUFError(VerbatimError):
    """A GGUF file that cannot be imported."""


class SnapshotError(VerbatimError):
    """A stored prompt-cache snapshot is missing, corrupt or does not match its index entry."""


class Cancelled(VerbatimError):
    """Work stopped through its `CancelToken`; nothing half-done was left behind."""
