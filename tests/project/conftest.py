"""The project-wide checks (import contracts, dependencies, platform, workflows, the mutation
list, test module imports) read the repository's files from its root; they share no fixture."""
