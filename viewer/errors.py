"""The viewer's one error: a source or option it cannot use, with the fix in the message."""


class ViewerError(Exception):
    """Bad PATH, pool URL or tokenizer; the CLI prints it and exits 2."""
