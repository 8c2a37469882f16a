"""Verbatim engine: models, templating, generation, prompt cache, persistence. No Qt here."""
