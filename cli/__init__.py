"""The `fatpipe` command group: one module per command, each imported only when it runs."""
