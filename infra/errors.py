"""The one error type every part raises for a user's mistake; the CLI turns it into a clean exit."""


class FatpipeError(Exception):
    """A problem the user can fix; `str()` is the one-line message, `exit_code` the process status."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(FatpipeError):
    """fatpipe.toml (or a flag standing in for it) is wrong; exit 2 like a usage error."""

    exit_code = 2
