"""The kbd daemon: one long-lived supervisor per user and results store, shared by commands.

- `state`: where a daemon lives (owner-only state directory, lock, socket, info file).
- `server`: the daemon (`kbd daemon run`).
- `client`: finding, starting, asking and stopping a daemon.
- `commands`: the `kbd daemon ...` command line.
"""
