"""The ``tidegate`` console script: one binary, one subcommand per component."""
