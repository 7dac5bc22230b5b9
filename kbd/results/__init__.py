"""Results: one kernel's `Record` (`record`), the statistics of its benchmark samples (`stats`)
and the SQLite store of sweeps and attempts (`store`)."""
