"""The doctor's findings, pure and through the command."""
