"""`kbd tune`: searching schedule configurations per kernel (supervisor side, no torch).

`search` chooses which configurations to measure next within a budget; `session` runs them as
sandboxed kbd jobs, keeps every trial in the tuning database (kbd.results.tuning), confirms the
best against the default in fresh processes and adopts it only on a confirmed gain. The space
comes from the descriptor's `Tune` section (kbd.plan.space); the finder applies adopted
configurations (kbd.plan.tuned, kbd.plan.pipelines).
"""
