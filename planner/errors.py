"""The user-mistake exception, importable without the specs (keeps `plan --help` fast)."""


class SpecError(ValueError):
    """A user mistake in an input: the message is one line, file: field: problem."""
