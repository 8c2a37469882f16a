"""Generation: the loop (restore, aligned prefill, last token alone, seeded decode), sampling,
prompt rendering and streamed text."""
