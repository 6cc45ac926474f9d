"""The subcommands' arguments, one module per subcommand with ``register(subparsers)``.

These modules import only argparse and the option helpers, so that ``--help`` and parsing load nothing
of the core. Each names its handler as ``"module:function"`` (``set_defaults(handler=...)``), and
``studio.cli`` imports that module only when the command runs.
"""
