"""One module per `tidegate` operations subcommand (configure_parser + run)."""
