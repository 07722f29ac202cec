"""SRE operations: the `tidegate get/describe/cordon/uncordon/drain/events/top/budget` commands.

Layout: pure helpers (`exitcodes`, `durations`, `selectors`, `target`, `render`), one I/O
adapter (`client`: the Admin gRPC stub with the bearer token, timeouts and fail-over between
control-plane addresses), and thin commands in `commands/` (one module per subcommand).
"""
