"""Hub access tried once, quickly: before the first hub dataset is loaded, one request to the hub's
endpoint (``huggingface_hub``'s session, ``HF_HUB_ETAG_TIMEOUT`` seconds, default 10; no retries)
says whether it answers. When it does not (or ``HF_HUB_OFFLINE`` is set) every hub load of the
process runs in offline mode: a dataset in the local cache loads, any other fails at once in one
line, instead of ``datasets``' retry loop (six tries with back-off per file: 23 s on a refused
connection, minutes when packets are dropped). The answer is kept for the process (per endpoint)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

_ANSWERS: dict[str, str | None] = {}


def unreachable() -> str | None:
    """None when the hub answers (any HTTP status); else why it is not used, in a few words."""
    # lazy: only for hub downloads
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    url = constants.ENDPOINT
    if url not in _ANSWERS:
        # lazy: only for hub downloads
        from huggingface_hub.utils import get_session

        try:
            get_session().head(url, timeout=float(constants.HF_HUB_ETAG_TIMEOUT))
            _ANSWERS[url] = None
        except Exception as e:  # a refused or dropped connection, DNS, a proxy
            _ANSWERS[url] = f"{url} did not answer: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
    return _ANSWERS[url]


@contextmanager
def _offline():
    """``datasets`` and ``huggingface_hub`` in offline mode (the local cache only) for the block;
    both read the flag at call time."""
    # lazy: datasets is heavy and only for hub data
    import datasets.config as dc

    # lazy: only for hub downloads
    from huggingface_hub import constants as hc

    old = dc.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE
    dc.HF_HUB_OFFLINE = hc.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        dc.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE = old


def access(why: str | None):
    """The context of a hub load: offline when ``why`` (from :func:`unreachable`) says the hub is
    not used."""
    return _offline() if why else nullcontext()
