"""The kbd daemon: one long-lived supervisor per user and results store, shared by commands.

- `state`: where a daemon lives (owner-only state directory, lock, socket, info file).
- `wire`: the messages between client and daemon (its identity is kbd.shared.identity).
- `server`: the daemon (`kbd daemon run`): connections, handshake, requests, lifetime.
- `work`: what a daemon runs: every client's sweeps and runs on one pool of cores and memory,
  warm templates, followers.
- `client`: finding, starting, asking and stopping a daemon.
- `submit`: `kbd run`, `kbd sweep`, `kbd attach` and `kbd cancel` through a daemon.
- `commands`: the `kbd daemon ...` command line.
"""
