"""Errors the user can fix. ``train.py`` prints them as one line (no traceback) and exits non-zero."""


class FLError(Exception):
    """Base class: a problem the user can fix; ``str(err)`` is a complete one-line message."""


class ConfigError(FLError):
    """A bad config value. Names the key, what is wrong and the fix."""

    def __init__(self, key: str, problem: str, fix: str):
        self.key, self.problem, self.fix = key, problem, fix
        super().__init__(f"config error: {key}: {problem}; fix: {fix}")


class NonFiniteLossError(FLError):
    """The training loss became NaN or inf; the run stops and keeps its last good checkpoint."""


class ReportError(FLError):
    """A path or option the report cannot use (one line)."""


class ResumeError(FLError):
    """A checkpoint cannot be resumed as asked (missing, or written by a config that changes results)."""


class StopRequested(Exception):
    """Raised after a checkpoint was written in response to SIGINT/SIGTERM/SIGUSR1 (not an error: the run can resume)."""

    def __init__(self, round_done: int, signum: int):
        self.round_done, self.signum = round_done, signum
        super().__init__(f"stopped by signal {signum} after round {round_done}")

