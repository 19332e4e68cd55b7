"""The `rlfleet` command's sub-commands, one module per group, each holding its handlers and
the parsers that call them (`add_parser(sub)`): `launch` (up, resume), `runs` (what reads a
run's directory), `cluster` (what talks to a running coordinator), `check` and `single`. The
roles' parsers are in `rlfleet.roles` and Slurm's in `rlfleet.slurm.submit`, beside what they
run; `rlfleet.cli` adds them all."""
