"""`graft report`: the paper's tables (markdown, LaTeX) and plots (PNG) from run and eval directories.

* :mod:`graft_cli.report.tables` — loading runs, Tables 1, 2/7/8, 9, 5, 4, 6, complementarity; rendering
* :mod:`graft_cli.report.plots` — reward, validation, clipped fraction, complementarity, compatibility plots
* :mod:`graft_cli.report.paper_numbers` — the paper's own numbers, shown side by side for paper pairs
"""
