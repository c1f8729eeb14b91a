"""The one error type a user sees: a one-line message that names the fix (CLI exit code 1)."""


class ReasonRLError(Exception):
    """A user-facing error. The CLI prints ``error: <message>`` and exits with code 1.

    The message is one line and says what to change (an option, a file, a stage to run first).
    """


class MissingArtifactError(ReasonRLError):
    """An input artifact is missing: the message names the stage that produces it."""
