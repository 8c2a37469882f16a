"""GGUF files: a validating reader and a converter to an mlx-lm model folder."""
