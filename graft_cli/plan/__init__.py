"""Plans of runs: ablation sweeps (`graft ablate`) and the miniature reproduction (`graft
reproduce`).

A *plan file* (``experiments/sweep/<name>.yaml``, ``experiments/reproduce/<pair>.yaml``) lists runs
as (name, method, overrides, seeds, partner); it expands to one training run per (entry, seed),
ordered so a stored-trajectory run comes after the GRPO run it reads. Executing a plan skips
finished runs, resumes partial ones (``train()`` resumes), evaluates each run (the eval API) and
records per-run results.

* :mod:`graft_cli.plan.spec` — plan files: loading, expansion, ordering, compose overrides
* :mod:`graft_cli.plan.status` — is a run finished / partial / new; is its evaluation done
* :mod:`graft_cli.plan.execute` — running a plan (train, eval; in-process or N worker processes)
* :mod:`graft_cli.plan.results` — each run's record from its directory, the plan's results files and
  table
* :mod:`graft_cli.plan.commands` — the `graft ablate` and `graft reproduce` commands
"""
