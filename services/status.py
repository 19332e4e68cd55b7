"""`rlfleet status`: a running cluster as tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.resources import describe_gpus


def league_table(league: dict[str, Any]) -> Table:
    """Players best first, with the main player's record against each and the chance PFSP
    gives it to be met next."""
    pay = league["payoff"]
    row = pay["players"].index("main") if "main" in pay["players"] else None
    table = Table(title=f"league: {league['games']:,} games")
    for col in ("#", "player", "kind", "version", "mu", "sigma", "ordinal", "rated games",
                "main's win/draw/loss", "next"):
        table.add_column(col, justify="right")
    probabilities = league.get("probabilities", {})
    for rank, p in enumerate(league["players"], 1):
        record = "-"
        if row is not None and p["name"] in pay["players"]:
            j = pay["players"].index(p["name"])
            record = f"{pay['win'][row][j]}/{pay['draw'][row][j]}/{pay['loss'][row][j]}"
        chance = probabilities.get(p["name"])
        table.add_row(str(rank), p["name"], p["kind"],
                      "-" if p["policy_version"] is None else str(p["policy_version"]),
                      f"{p['mu']:.2f}", f"{p['sigma']:.2f}", f"{p['ordinal']:.2f}",
                      f"{p['games']:,}", record,
                      "-" if chance is None else f"{100 * chance:.1f}%")
    return table


def resource_cells(res: dict[str, Any] | None) -> tuple[str, str, str, str]:
    """host, cpus, memory and GPUs of a worker's reported resources; `-` where it reported
    none."""
    if res is None:
        return ("-", "-", "-", "-")
    return (res["hostname"], str(res["cpu_cores"]), f"{res['memory_bytes'] / 2**30:.1f} GiB",
            describe_gpus(res["gpus"]))


def slurm_cell(res: dict[str, Any] | None) -> str:
    """`job 4242 on n2` (`, requeued 1x` after a requeue) for a worker Slurm runs; `-`."""
    slurm = (res or {}).get("slurm")
    if not slurm:
        return "-"
    again = f", requeued {slurm['restart_count']}x" if slurm.get("restart_count") else ""
    return f"job {slurm['job_id']} on {slurm['node']}{again}"


def epsilon_cell(w: dict[str, Any]) -> str:
    """The epsilon a collector explores with, as its last heartbeat said (Ape-X: its slot's
    fixed one); `-` for a worker that reported none (a learner, a policy that is not
    epsilon-greedy)."""
    eps = (w.get("status") or {}).get("epsilon")
    return "-" if eps is None else f"{eps:.4g}"


def print_status(coordinator_url: str) -> int:
    console = Console()
    client = HttpClient(coordinator_url, timeout_s=5, retries=1)
    try:
        s = client.get(f"{API}/status")
    except HttpError as err:
        console.print(f"[red]cannot read status from {coordinator_url}: {err}[/]")
        return 1
    finally:
        client.close()
    run, c, r, b = s["run"], s["counters"], s["rates"], s["buffer"]
    ev = s.get("latest_evaluation")
    head = Table(title=f"run {run['name']}: {run['state']}"
                 + (f" ({run['stop_reason']})" if run["stop_reason"] else ""))
    for col in ("env steps", "steps/s", "train it", "it/s", "policy", "chunks", "last eval"):
        head.add_column(col, justify="right")
    head.add_row(f"{c['env_steps']:,}", f"{r['env_steps_per_s']:,.0f}",
                 f"{c['train_iterations']:,}", f"{r['train_iterations_per_s']:,.0f}",
                 str(c["policy_version"]), f"{b['chunks']:,}",
                 f"{ev['return_mean']:.1f}" if ev else "-")
    console.print(head)
    if run.get("slurm"):
        console.print(f"coordinator: {slurm_cell({'slurm': run['slurm']})}")
    buffers = Table(title="buffers")
    for col in ("name", "kind", "size", "inserts/s", "samples/s", "uses mean/max",
                "staleness", "evicted", "dropped"):
        buffers.add_column(col, justify="right")
    for name, st in s.get("buffers", {}).items():
        buffers.add_row(name, str(st["kind"]), f"{st['size']:,.0f}/{st['capacity']:,.0f}",
                        f"{st['inserts_per_s']:,.0f}", f"{st['samples_per_s']:,.0f}",
                        f"{st['use_count_mean']:.1f}/{st['use_count_max']:.0f}",
                        f"{st['staleness_mean']:.0f}", f"{st['evicted_items']:,.0f}",
                        f"{st['dropped_items']:,.0f}")
    console.print(buffers)
    workers = Table(title="workers")
    slurm = any((w.get("resources") or {}).get("slurm") for w in s["workers"])
    for col in ("id", "role", "state", "eps", "url", "last heartbeat", "host", "cpus", "mem",
                "GPUs", *(("slurm",) if slurm else ())):
        workers.add_column(col)
    for w in s["workers"]:
        workers.add_row(w["worker_id"], w["role"], w["state"], epsilon_cell(w), w["url"],
                        f"{w['seconds_since_heartbeat']:.1f}s ago",
                        *resource_cells(w.get("resources")),
                        *((slurm_cell(w.get("resources")),) if slurm else ()))
    console.print(workers)
    group = s.get("learner_group")
    if group:
        last = group.get("last_reformation") or {}
        title = (f"learner group: generation {group['generation']}, world size "
                 f"{group['world_size']}, {group['reformations']} re-formations"
                 + (f" (last: {last['reason']})" if last else ""))
        ranks = Table(title=title)
        for col in ("rank", "worker", "updates/s", "all-reduce ms"):
            ranks.add_column(col, justify="right")
        for r in group["ranks"]:
            ranks.add_row(str(r["rank"]), r["worker_id"], f"{r['updates_per_s']:,.1f}",
                          f"{r['allreduce_ms']:.2f}")
        for w in group.get("standby", []):
            ranks.add_row("standby", w, "-", "-")
        console.print(ranks)
    league = s.get("league")
    if league:
        console.print(league_table(league))
    tasks = Table(title="active tasks")
    for col in ("id", "kind", "worker", "state"):
        tasks.add_column(col)
    for t in s["tasks"]:
        tasks.add_row(t["task_id"], t["kind"], t["worker_id"], t["state"])
    console.print(tasks)
    for alert in s.get("alerts", []):  # last, where the eye lands: what went wrong quietly
        console.print(f"[bold red]alert[/] ({alert['kind']}): {escape(alert['message'])}")
    return 0
