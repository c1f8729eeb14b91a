"""`reasonrl ablate`'s machinery, one module a job: ``plan`` (the rungs, seeds and every run's
overrides, checked as the runs will build them), ``jobs`` (the runs as processes: their command
lines, states, running them N at once), ``stats`` (a finished run's numbers and ablation.json's
table of them, with the intervals) and ``table`` (the console's tables). The stage itself
(`reasonrl.stages.ablate`: its options, ``run_ablate``) composes them."""
