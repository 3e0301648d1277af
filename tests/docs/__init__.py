"""The documentation: every command it shows runs, and its catalogues are complete."""
