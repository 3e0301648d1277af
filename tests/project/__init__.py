"""The project's own rules: ruff, mypy, the import contracts, the module map, the README's
commands."""
