"""Development tooling of this repository: a throwaway PostgreSQL and child processes.

`make test`, `make demo` and the benchmarks use it; it is not part of the installed package
(pyproject.toml's packages are `switchboard_todos` only), nor of the example a project copies.
"""
