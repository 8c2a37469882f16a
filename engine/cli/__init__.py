"""`python -m engine`: the headless front end (generate, chat, models, import, download)."""
