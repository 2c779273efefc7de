"""Analyses of runs and checkpoints: cross-model complementarity
(:mod:`graft_cli.analysis.complementarity`)."""
