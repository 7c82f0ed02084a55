"""The command line's jobs, apart from the library: the row -> column demo (``demo``), the
environment report (``doctor``), ``explain`` and its MoE form, one rank's plan report
(``rank_report``), and the commands' shared parsing and output (``cli_common``, ``cli_plan``).
``reshard.cli`` holds the parser and entry point."""
