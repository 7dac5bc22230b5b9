"""Which configurations of a task to measure next, within a budget of measurements.

A space no larger than the budget is measured whole. A larger one is searched: first the
default, the seeds (the adopted configurations of the same schedule for other shapes, when they
are in this space) and a spread of random configurations; then, round after round, the
neighbours of the best configurations so far (one variable moved one step in its domain), and
random configurations again when every neighbour has been measured. Every configuration that
has a trial counts against the budget, and none is proposed twice, so a failing configuration
is never measured again. Deterministic for a given seed.
"""

from __future__ import annotations

import random

from kbd.plan.space import Config, Space
from kbd.plan.tuned import config_text
from kbd.results.tuning import Trial

TOP = 3  # the neighbourhoods of this many best configurations are searched each round


class Search:
    def __init__(
        self,
        space: Space,
        configs: list[Config],
        budget: int,
        seeds: list[Config] = (),
        seed: int = 0,
    ):
        self.space = space
        self.configs = configs  # every valid configuration, the default first
        self.budget = budget
        self._valid = {config_text(c) for c in configs}
        self._seeds = [s for s in seeds if config_text(s) in self._valid]
        self._random = random.Random(seed)

    @property
    def exhaustive(self) -> bool:
        return len(self.configs) <= self.budget

    def next(self, trials: list[Trial], size: int) -> list[Config]:
        """Up to `size` configurations to measure next, given every trial so far; empty when the
        budget is spent or nothing is left."""
        tried = {config_text(t.config) for t in trials if t.stage == "search"}
        left = self.budget - len(tried)
        if left <= 0:
            return []
        size = min(size, left)
        if self.exhaustive:
            return [c for c in self.configs if config_text(c) not in tried][:size]
        proposed: list[Config] = []

        def take(config: Config) -> None:
            text = config_text(config)
            fresh = all(config_text(p) != text for p in proposed)
            if text in self._valid and text not in tried and len(proposed) < size and fresh:
                proposed.append(config)

        initial = min(max(4, self.budget // 4), len(self.configs))
        for config in [self.configs[0], *self._seeds]:
            take(config)
        if len(tried) < initial:
            for config in self._random.sample(self.configs, len(self.configs)):
                if len(proposed) >= min(size, initial - len(tried)):
                    break
                take(config)
            if proposed:
                return proposed
        timed = sorted((t for t in trials if t.timed), key=lambda t: -t.speedup)
        for trial in timed[:TOP]:
            for neighbour in self._neighbours(trial.config):
                take(neighbour)
        if not proposed:  # every neighbour measured: a random restart
            for config in self._random.sample(self.configs, len(self.configs)):
                take(config)
                if len(proposed) >= size:
                    break
        return proposed

    def _neighbours(self, config: Config) -> list[Config]:
        """The configurations one variable one step away in its domain, nearest first."""
        found = []
        for name, values in self.space.domains.items():
            if config.get(name) not in values:
                continue
            index = values.index(config[name])
            for step in (-1, 1):
                if 0 <= index + step < len(values):
                    found.append({**config, name: values[index + step]})
        # two variables at once, for tiles whose sizes must move together
        names = list(self.space.domains)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                for a in (-1, 1):
                    for b in (-1, 1):
                        moved = dict(config)
                        ok = True
                        for name, step in ((first, a), (second, b)):
                            values = self.space.domains[name]
                            if config.get(name) not in values:
                                ok = False
                                break
                            index = values.index(config[name]) + step
                            if not 0 <= index < len(values):
                                ok = False
                                break
                            moved[name] = values[index]
                        if ok:
                            found.append(moved)
        return found
