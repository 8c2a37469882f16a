"""Documents in the chat: a file's text, read once (extract.py: which reader; pdf.py, word.py),
within limits for a file from anyone (bounded.py, child.py), placed where every conversation
puts it so the prompt cache shares its state (placement.py); what a document is (document.py)."""
