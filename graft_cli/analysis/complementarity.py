"""An alias of :mod:`graft_cli.eval.complementarity` for :mod:`graft_cli.report.claims`, which
imports :func:`from_runs` from here: claims.py is analysis code a study registered (its sha256 is in
``results/tiny_ladder/registration.json``), so its import line stays as registered. Everything else
imports :mod:`graft_cli.eval.complementarity`."""

from graft_cli.eval.complementarity import from_runs

__all__ = ["from_runs"]
