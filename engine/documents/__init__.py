"""Documents in the chat: a file's text, read once (extract.py), placed where every
conversation puts it so the prompt cache shares its state (placement.py)."""
