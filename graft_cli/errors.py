"""One exception type for user-facing errors: the CLI prints its message as one line."""


class GraftError(Exception):
    """A bad input (config key, file line, option) described in one line."""


class Stopped(GraftError):
    """A run or plan stopped by a signal (a scheduler's preemption): the CLI exits with
    ``exit_code`` (143, the shell's code for SIGTERM, so a scheduler reads it as the preemption it
    sent) after one line."""

    exit_code = 143


class PeerLost(GraftError):
    """A data-parallel rank lost its peers: a collective failed (another rank died: its connections
    closed) or waited past ``run.dist_timeout_s`` (another rank hung). One line, exit 75
    (``EX_TEMPFAIL``: relaunching every rank resumes from the last complete checkpoint)."""

    exit_code = 75
