"""The wire formats, one module each, none importing another (pyproject's import contracts):
chat.py (OpenAI chat completions and completions), responses.py (OpenAI Responses), messages.py
(Anthropic Messages). Each parses its body into the engine's `GenerationRequest` and renders the
one generation path's events (engine/serve/generation.py, reply.py) in its own shapes."""
