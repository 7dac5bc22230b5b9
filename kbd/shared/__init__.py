"""The shared contract: what both sides of the process boundary agree on.

The only part of kbd that the worker side (`kbd.worker`) may import besides itself: the messages
between supervisor and worker (`protocol`), the outcome table (`outcomes`), shape strings
(`shapes`), errors, process trees (`proctree`), containment's vocabulary (`containment`) and
kbd's identity (`identity`). Nothing here imports torch, or any other layer of kbd.
"""
