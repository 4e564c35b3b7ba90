"""Errors the user can fix. ``train.py`` prints them as one line (no traceback) and exits non-zero."""


class FLError(Exception):
    """Base class: a problem the user can fix; ``str(err)`` is a complete one-line message."""


class ConfigError(FLError):
    """A bad config value. Names the key, what is wrong and the fix."""

    def __init__(self, key: str, problem: str, fix: str):
        self.key, self.problem, self.fix = key, problem, fix
        super().__init__(f"config error: {key}: {problem}; fix: {fix}")


class DiskError(FLError):
    """An operating-system error while reading or writing data or a cache: the path, the errno and the fix (not a
    config error: the config may be right and the disk full)."""

    def __init__(self, what: str, err: OSError):
        import errno as codes

        self.err = err
        path = err.filename or "?"
        fixes = {codes.ENOSPC: "free space there, or point FL_CACHE_DIR at a folder with room",
                 codes.EDQUOT: "free space there, or point FL_CACHE_DIR at a folder with room",
                 codes.EACCES: "make it writable for this user, or point FL_CACHE_DIR at a folder that is",
                 codes.EPERM: "make it writable for this user, or point FL_CACHE_DIR at a folder that is",
                 codes.EROFS: "point FL_CACHE_DIR (or the data key naming the path) at a writable folder"}
        fix = fixes.get(err.errno, "check that path and its filesystem; caches live under FL_CACHE_DIR "
                                   "(default ~/.cache/fl_lightning) and may be deleted to be rebuilt")
        name = codes.errorcode.get(err.errno, str(err.errno)) if err.errno is not None else "no errno"
        super().__init__(f"disk error: {what}: {err.strerror or err} ({name}) at {path}; fix: {fix}")


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

