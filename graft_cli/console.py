"""One place that makes rich consoles for every command.

``emoji=False``: rich would otherwise render ``:a:`` in ``tiny:a: avg=...`` as an emoji (🅰), and
model names, paths and hub ids are full of colons."""

from __future__ import annotations

import logging
import os
import warnings

from rich.console import Console


def make_console(**kwargs) -> Console:
    kwargs.setdefault("emoji", False)
    return Console(**kwargs)


def quiet_libraries(verbose: bool = False) -> None:
    """Silence the progress bars and advisory warnings of transformers, datasets and huggingface_hub
    ("Loading weights", "Writing model shards", ...) unless ``verbose``: graft's own progress says
    what is happening."""
    if verbose:
        return

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    for name in ("transformers", "datasets", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        # lazy: transformers is slow to import
        from transformers.utils import logging as tlog

        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
    except Exception:  # transformers not importable here: nothing of it to silence
        pass
    try:
        # lazy: datasets is heavy and only for hub data
        import datasets

        datasets.disable_progress_bars()
    except Exception:
        pass
    warnings.filterwarnings("ignore", module="transformers")
