"""The module name under which :mod:`graft_cli.report.claims` imports the complementarity of runs
(:mod:`graft_cli.analysis.complementarity`, an alias of :mod:`graft_cli.eval.complementarity`)."""
