"""Models: resolve what a user names, discover what is installed, identity (model key),
downloads, and GGUF import."""
