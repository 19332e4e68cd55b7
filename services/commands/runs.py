"""What reads a run's directory, during the run or after it: `rlfleet export`, `checkpoints`,
`plot`, `battle`, `play` and `serve-policy`. Each handler calls the module that does the work
(`services/export.py`, `play.py`, `policy_server.py`, ...), imported when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlfleet.command import PORT, POSITIVE, SECONDS, env, setup_logging
from rlfleet.commands.arguments import checkpoint_option
from rlfleet.shared.contract.config import ConfigError


def cmd_export(args: argparse.Namespace) -> int:
    """A run's collected episodes as a Minari dataset (`services/export.py`)."""
    from rlfleet.export import export_run

    done = export_run(args.run_dir, args.out, args.dataset_id, args.source, args.min_return,
                      args.max_return, args.limit, args.episodes, args.greedy,
                      checkpoint=args.checkpoint)
    print(f"exported {done.episodes} episodes ({done.steps} steps, mean return "
          f"{done.mean_return:.1f}) {done.origin} as {done.dataset_id} to {done.path}")
    for why in done.passed_over:  # --source auto: the sources tried before this one
        print(f"  passed over {why}")
    print(f"read it with: MINARI_DATASETS_PATH={Path(args.out).resolve()} python -c "
          f"\"import minari; print(minari.load_dataset('{done.dataset_id}'))\"")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from rlfleet.plot import plot

    try:
        result = plot([Path(d) for d in args.run_dir], Path(args.out) if args.out else None)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(str(err)) from None
    print(f"{result.path}: {', '.join(result.series)}")
    return 0


def cmd_battle(args: argparse.Namespace) -> int:
    from rlfleet.battle import battle_run, print_battle

    print_battle(battle_run(Path(args.run_dir), args.games, args.seed,
                            Path(args.policy) if args.policy else None))
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    """A run's best policy playing its env (`services/play.py`)."""
    from rlfleet.play import play_run, print_played

    print_played(play_run(Path(args.run_dir), args.episodes, args.video, args.stochastic,
                          args.seed, checkpoint=args.checkpoint))
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """A run's kept checkpoints with their metadata (`services/checkpoints_cli.py`)."""
    from rlfleet.checkpoints_cli import main

    return main(args.run_dir, args.json)


def cmd_serve_policy(args: argparse.Namespace) -> int:
    """A run's best policy over HTTP (`services/policy_server.py`)."""
    from rlfleet.policy_server import serve_policy

    setup_logging("serve-policy")
    return serve_policy(Path(args.run_dir), args.host, args.port, args.threads, args.reload_s,
                        checkpoint=args.checkpoint)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`rlfleet export`, `checkpoints`, `plot`, `battle`, `play` and `serve-policy`."""
    ex = sub.add_parser("export", help="write a run's collected episodes as a Minari dataset")
    ex.add_argument("run_dir")
    ex.add_argument("--out", required=True, help="Minari datasets root to write under")
    ex.add_argument("--dataset-id", default=None,
                    help="namespace/name-vN (default: rlfleet/<run name>-v0)")
    ex.add_argument("--source", default="auto", choices=("auto", "saved", "snapshot", "policy"),
                    help="the buffer saver's episodes (collector.save_to), a buffer snapshot, "
                    "or episodes played by the run's best policy; auto (the default): the "
                    "first of these, in this order, that holds a whole episode")
    ex.add_argument("--episodes", type=int, default=20,
                    help="--source policy (and auto when it falls back to it): episodes to "
                    "play")
    ex.add_argument("--greedy", action="store_true",
                    help="--source policy (and auto when it falls back to it): act as "
                    "evaluated (deterministic actions) instead of as when collecting (DQN: "
                    "epsilon at its final value)")
    ex.add_argument("--min-return", type=float, default=None,
                    help="keep only episodes that scored at least this")
    ex.add_argument("--max-return", type=float, default=None,
                    help="keep only episodes that scored at most this")
    ex.add_argument("--limit", type=int, default=None, help="the first N episodes kept")
    checkpoint_option(ex, "play the episodes with the policy of the checkpoint at train "
                      "iteration N (`rlfleet checkpoints RUN_DIR` lists them) instead of the "
                      "best policy; implies --source policy")
    ex.set_defaults(func=cmd_export)

    ck = sub.add_parser("checkpoints", help="list the checkpoints a run kept (train "
                        "iteration, policy version, best, time, size, metadata)")
    ck.add_argument("run_dir", help="runs/<name>")
    ck.add_argument("--json", action="store_true", help="print JSON (for tools) instead of "
                    "a table")
    ck.set_defaults(func=cmd_checkpoints)

    pl = sub.add_parser("plot", help="draw a run's learning curves and timers to a PNG; "
                        "several runs: their returns on shared axes")
    pl.add_argument("run_dir", nargs="+", help="runs/<name> (several: compared, with --out)")
    pl.add_argument("--out", default=None, help="default: <run_dir>/curves.png")
    pl.set_defaults(func=cmd_plot)

    b = sub.add_parser("battle", help="a self-play run's trained policy against the league's "
                       "bots and its first snapshot, N games from each seat")
    b.add_argument("run_dir", help="runs/<name>")
    b.add_argument("--games", type=int, default=200, help="games per opponent and seat")
    b.add_argument("--seed", type=int, default=12345)
    b.add_argument("--policy", default=None, help="default: <run_dir>/best_policy.safetensors")
    b.set_defaults(func=cmd_battle)

    pp = sub.add_parser("play", help="a run's best policy playing the run's env: each "
                        "episode's return and length")
    pp.add_argument("run_dir", help="runs/<name>")
    pp.add_argument("--episodes", type=int, default=10)
    pp.add_argument("--video", default=None, help="write the first episode as MP4 here "
                    "(the video extra)")
    pp.add_argument("--stochastic", action="store_true", help="act as collectors do "
                    "(sampled, epsilon-greedy) instead of as evaluated (deterministic)")
    pp.add_argument("--seed", type=int, default=None, help="default: the run's seed")
    checkpoint_option(pp)
    pp.set_defaults(func=cmd_play)

    sp = sub.add_parser("serve-policy", help="serve a run's best policy over HTTP: POST /act "
                        "(observations in, actions out, batched)")
    sp.add_argument("run_dir", help="runs/<name>")
    sp.add_argument("--host", default=env("HOST", "127.0.0.1"))
    sp.add_argument("--port", type=PORT, default=env("PORT", "8080"))
    sp.add_argument("--threads", type=POSITIVE, default=env("THREADS", "4"),
                    help="HTTP threads (inference runs one batch at a time)")
    sp.add_argument("--reload-s", type=SECONDS, default=env("RELOAD_S", "5"),
                    help="seconds between checks for a newer best policy in RUN_DIR (a run "
                    "still training), swapped in without a restart; 0: never")
    checkpoint_option(sp, "serve the policy of the checkpoint at train iteration N "
                      "(`rlfleet checkpoints RUN_DIR` lists them) instead of the best "
                      "policy; it is never reloaded")
    sp.set_defaults(func=cmd_serve_policy)
