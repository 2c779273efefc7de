"""`graft report`: the paper's tables (markdown, LaTeX) and plots (PNG) from run and eval
directories.

* :mod:`graft_cli.report.runs` — loading runs and identifying their variants;
  :mod:`graft_cli.report.render` — a table in markdown and LaTeX
* :mod:`graft_cli.report.tables` — Tables 1, 2/7/8, 9, 5, 4, 6, complementarity, code; `graft
  report`
* :mod:`graft_cli.report.plots` — reward, validation, clipped fraction, complementarity,
  compatibility plots
* :mod:`graft_cli.report.paper_numbers` — the paper's own numbers, shown side by side for paper
  pairs
"""
