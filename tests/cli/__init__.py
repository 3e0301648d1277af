"""The commands as a user runs them: flags, environment, settings files, exit statuses, the kubectl
plugin."""
