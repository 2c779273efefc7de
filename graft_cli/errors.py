"""One exception type for user-facing errors: the CLI prints its message as one line."""


class GraftError(Exception):
    """A bad input (config key, file line, option) described in one line."""
