"""Subcommands of ``quant-studio-cli``; each module has ``register(subparsers)``."""
